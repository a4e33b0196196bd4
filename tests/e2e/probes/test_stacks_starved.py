"""End to end: sampling starvation: a box too busy to give py-spy CPU on time. The probe says so in
its status, with the fix, and the verdict counts the samples at the share it recorded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.stacks.probe import StackConfig, StackProbe
from gpudiag.probes.stacks.pyspy import find_py_spy
from tests.conftest import BURN

JOB = "import time\nt0 = time.time()\nwhile time.time() - t0 < 60:\n    sum(range(5000))\n"


def _on_core0() -> None:
    os.sched_setaffinity(0, {0})


# the sampler's wrapper: `dump` (the probe's check that py-spy can read the job) runs as it is;
# `record` runs behind three burners at nice 15 on core 0 and is also held off the CPU for
# HOLD_S once it has started, as a box too busy to schedule it would. The hold makes the
# starvation certain: the scheduler alone gave it 1% of the core on one box and two thirds on
# CI's, and the test failed there.
HOLD_S = 6.0

WRAPPER = """#!{python}
import os, signal, subprocess, sys, time
real = {real!r}
if sys.argv[1:2] == ["dump"]:
    os.execv(real, [real, *sys.argv[1:]])
spy = subprocess.Popen(["nice", "-n", "15", "taskset", "-c", "0", real, *sys.argv[1:]])
def forward(sig, _frame):
    os.kill(spy.pid, signal.SIGCONT)
    os.kill(spy.pid, sig)
signal.signal(signal.SIGINT, forward)
signal.signal(signal.SIGTERM, forward)
time.sleep(0.2)
os.kill(spy.pid, signal.SIGSTOP)
time.sleep({hold})
os.kill(spy.pid, signal.SIGCONT)
sys.exit(spy.wait())
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
@pytest.mark.long
def test_py_spy_starved_by_burners_is_said_in_the_probe_status(tmp_path, monkeypatch):
    """Real burners: three processes burning core 0, and py-spy confined to that core at a
    low priority and held off it for HOLD_S, sampling a real job at 100 Hz. It cannot keep
    its rate; the probe measures what it recorded against what it asked for."""
    real = find_py_spy()
    if real is None or shutil.which("taskset") is None:
        pytest.skip("needs py-spy and taskset")
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(WRAPPER.format(python=sys.executable, real=real, hold=HOLD_S))
    wrapper.chmod(0o755)
    monkeypatch.setattr("gpudiag.probes.stacks.probe.find_py_spy", lambda: str(wrapper))
    job = subprocess.Popen([sys.executable, "-c", JOB])
    burners = [
        subprocess.Popen([sys.executable, "-c", BURN], preexec_fn=_on_core0) for _ in range(3)
    ]
    probe = StackProbe(StackConfig(rate_hz=100, window_s=2.0, gil_rate_hz=0, subprocesses=False))
    try:
        assert probe.open(Target(job.pid)).available
        # one window is the evidence: its wall time (at least HOLD_S) and the ticks py-spy
        # recorded in it (at most 2 s at 100 Hz); the time limit only bounds a failure
        deadline = time.monotonic() + 50
        while probe.windows_read < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        probe.close()
        for p in (job, *burners):
            p.kill()
            p.wait()
    got = probe.achieved()
    assert got is not None and got < 0.5, got
    status = probe.final_status()
    assert status is not None and status.available
    assert "sampling fell behind" in (status.reason or "") and "nice" in (status.hint or "")
