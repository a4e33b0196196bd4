"""`run --duration` counts from the job's first step, and a look that ends before it says so."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import gpudiag_until_sure

SLOW_START = (
    "import sys, time\ntime.sleep(float(sys.argv[1]))  # a slow start-up (a 20 s torch import)\n"
    "import torch\nm = torch.nn.Linear(64, 64)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
    "t0 = time.time()\nwhile time.time() - t0 < float(sys.argv[2]):\n"
    "    m(torch.randn(32, 64)).sum().backward()\n    opt.step()\n    opt.zero_grad()\n"
)


def _run_slow(tmp_path, duration: str, sleep: str, loop: str):
    job, out = tmp_path / "slow.py", tmp_path / "r.json"
    job.write_text(SLOW_START)
    # output through files and the job left running killed: no wait for the job to end
    r = gpudiag_until_sure(
        *("run", "-q", "--duration", duration, "--out", str(out)),
        *("--", sys.executable, str(job), sleep, loop),
        tmp=tmp_path,
        timeout=180,
    )
    return r, out


@pytest.mark.long
def test_run_duration_counts_from_the_first_step(tmp_path):
    """`run --duration 25` of a job with a 17.6 s start-up got 9.5-12 s of loop: the clock
    now restarts at the first step, so the whole look goes to the loop. The job's loop runs far
    past the look (the look ends it): on a busy box its first step is seen late, and a loop
    that ends 4 s after the look's end left the look short (load 8)."""
    r, out = _run_slow(tmp_path, "10", "1", "60")
    assert r.returncode == 0, r.stderr
    ph = json.loads(out.read_text())["phases"]
    assert ph["startup_s"] >= 1.0 and ph["loop_s"] >= 8.5, ph
    assert "start-up only" not in r.stderr


def test_a_look_that_ends_before_the_first_step_says_so(tmp_path):
    """No step within --duration: the look ends on time, and says it saw start-up only."""
    r, _ = _run_slow(tmp_path, "2", "5", "0")
    assert r.returncode == 0, r.stderr
    assert "no step of the job's loop in 2 s: the look saw its start-up only" in r.stderr
