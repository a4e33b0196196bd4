"""A server's front end and its other processes are the job's, not "other processes on the
box": attached to LitServe's model worker, HOST002 had named its own uvicorn process as the
box's other work taking the CPU."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from gpudiag.probes.base import Target
from gpudiag.probes.host.probe import HostProbe

SLEEPY = (
    "import subprocess,sys; subprocess.run([sys.executable,'-c','import time; time.sleep(60)'])"
)


def _mine(target: Target, monkeypatch) -> set[int]:
    """The pids the probe counts as the job's (gpudiag here being the target itself: pytest's
    own children would be gpudiag's)."""
    monkeypatch.setattr("gpudiag.probes.host.probe.os.getpid", lambda: target.pid)
    probe = HostProbe()
    assert probe.open(target).available
    return probe.mine()


def test_a_servers_tree_is_the_jobs_not_the_boxs(monkeypatch):
    front = subprocess.Popen([sys.executable, "-c", SLEEPY])
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.time() + 30
        while not psutil.Process(front.pid).children():
            assert time.time() < deadline
            time.sleep(0.05)
        sibling = psutil.Process(front.pid).children()[0].pid
        assert sibling not in _mine(
            Target(worker.pid), monkeypatch
        )  # another process: the box's work
        assert {front.pid, sibling, worker.pid} <= _mine(
            Target(worker.pid, server=front.pid), monkeypatch
        )
    finally:
        for k in psutil.Process(front.pid).children(recursive=True):
            k.kill()
        front.kill()
        worker.kill()
        front.wait()
        worker.wait()
