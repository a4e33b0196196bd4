"""End to end: A server under a supervisor (Werkzeug's reloader, uvicorn's and gunicorn's): the
hooks say which process does the work, and the stacks follow it there from the target that only
waits."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpudiag.agent.session.session import descends_from
from gpudiag.analyzers.measures.workload import is_handling
from gpudiag.probes.base import Target
from gpudiag.probes.stacks.probe import StackConfig, StackProbe


def test_descends_from_reads_the_parents_up_the_tree():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert descends_from(child.pid, os.getpid())
        assert descends_from(child.pid, os.getppid())
        assert not descends_from(os.getpid(), child.pid)
        assert not descends_from(2**22 + 7, os.getpid())  # no such process
    finally:
        child.kill()
        child.wait()


def test_follow_records_the_child_as_the_loop_and_no_longer_as_a_worker(tmp_path):
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.call([sys.executable, "
            "'-c', 'import time; time.sleep(30)'])",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        probe = StackProbe(StackConfig(gil_rate_hz=0))
        probe.target = Target(parent.pid)
        probe._tmp = type("T", (), {"name": str(tmp_path)})()
        while not probe._workers() and time.monotonic() < deadline:
            time.sleep(0.05)
        (kid,) = probe._workers()
        runs, alive = probe._plan(1)
        assert [r.pid for r in runs if r.mode == "all"] == [parent.pid] and alive == 1
        probe.follow(kid)
        assert probe.loop_pid == kid and probe._cut
        runs, alive = probe._plan(2)
        assert [r.pid for r in runs if r.mode == "all"] == [kid] and alive == 0
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize(
    "supervisor",
    [
        "/x/werkzeug/_reloader.py:restart_with_reloader:1",
        "/x/uvicorn/supervisors/multiprocess.py:run:1",
        "/x/gunicorn/arbiter.py:sleep:1",
    ],
)
def test_a_supervisor_waiting_on_its_server_is_not_a_request_handled(supervisor):
    path, func, line = supervisor.rsplit(":", 2)
    stack = (
        f"<module> (/app/app.py:37);run_simple (/x/werkzeug/serving.py:1);"
        f"{func} ({path}:{line});wait (/usr/lib/python3.11/subprocess.py:1)"
    )
    assert not is_handling(stack)
    assert is_handling("<module> (/app/app.py:37);handle (/x/werkzeug/serving.py:1)")
