"""End to end: `gpudiag run` loads its hooks through a sitecustomize on PYTHONPATH; a Python run
with -I, -E or -S (or a Triton Python backend's stub, embedded and isolated) never imports it. The
hooks' status then says why and what loads them instead, not "the job did not import torch"."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from gpudiag.agent.output.report import load_report
from gpudiag.probes.inprocess.isolation import hooks_blocked
from tests.conftest import gpudiag

JOB = (
    "import time, torch\nm = torch.nn.Linear(32, 32)\nt0 = time.time()\n"
    "with torch.no_grad():\n    while time.time() - t0 < 6:\n"
    "        m(torch.randn(1, 32)); time.sleep(0.002)\n"
)


def _sleeper(*flags: str) -> subprocess.Popen:
    """A Python started with `flags`, once it runs (before its exec the child's command line
    is still its parent's: pytest's)."""
    proc = subprocess.Popen([sys.executable, *flags, "-c", "import time; time.sleep(30)"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if "-c" in psutil.Process(proc.pid).cmdline():
                break
        except psutil.Error:
            pass
        time.sleep(0.01)
    return proc


@pytest.mark.parametrize(("flags", "said"), [(("-I",), "-I"), (("-s", "-E"), "-E"), ((), None)])
def test_a_python_run_isolated_is_told_from_its_command_line(flags, said):
    proc = _sleeper(*flags)
    try:
        why = hooks_blocked(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert (why is None) if said is None else (why is not None and said in why)


def test_a_job_gone_is_read_from_the_command_that_launched_it():
    proc = _sleeper()
    proc.kill()
    proc.wait()
    assert "-S" in (hooks_blocked(proc.pid, ["/usr/bin/python3", "-S", "x.py"]) or "")
    assert hooks_blocked(proc.pid, ["/usr/bin/env", "-S", "x"]) is None  # not a Python


@pytest.mark.long
def test_run_of_an_isolated_python_says_why_the_hooks_are_silent(tmp_path):
    pytest.importorskip("torch")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out = tmp_path / "r.json"
    res = gpudiag(
        "run", "-q", "--duration", "4", "--out", str(out), "--", sys.executable, "-I", str(job)
    )
    assert res.returncode == 0, res.stderr
    hooks = next(p for p in load_report(out)["probes"] if p["name"] == "hooks")
    assert "runs with -I" in hooks["reason"] and "--hooks" in hooks["hint"]
