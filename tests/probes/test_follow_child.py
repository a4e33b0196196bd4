"""A server under a supervisor (Werkzeug's reloader, uvicorn's and gunicorn's): the hooks say
which process does the work, and the stacks follow it there from the target that only waits."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpudiag.agent.session.session import descends_from
from gpudiag.analyzers.measures.workload import is_handling
from gpudiag.probes.base import Sample, Target
from gpudiag.probes.inprocess.channel import HookProbe
from gpudiag.probes.stacks.probe import StackConfig, StackProbe


def _work(kind: str, n: int) -> list[Sample]:
    return [Sample("hooks", 0, {"kind": kind}, {"x": 1.0}) for _ in range(n)]


def test_the_worker_is_the_child_sending_work_while_the_target_sends_none():
    hooks = HookProbe()
    assert hooks.worker(100) is None  # nothing came yet
    hooks._count_work(101, _work("request", 3) + _work("forward", 3))
    hooks._count_work(102, _work("request", 1))
    hooks._count_work(101, _work("hello", 5))  # not work
    assert hooks.work == {101: 9, 102: 1}  # a forward weighs two requests
    assert hooks.worker(100) is None  # under FOLLOW_MIN yet
    hooks._count_work(101, _work("request", 11))
    assert hooks.worker(100) == 101
    hooks._count_work(100, _work("step", 1))  # the target works itself: nothing to follow
    assert hooks.worker(100) is None


def test_a_child_followed_early_is_left_for_one_doing_far_more_work():
    """Ray Serve: its dashboard agent answered health checks before the load reached the
    replica; the stacks followed the agent and read LOOP001, sure, on it. Another child is
    followed once it sent twice the units, and the model's forwards weigh more than the
    proxy's requests."""
    hooks = HookProbe()
    hooks._count_work(201, _work("request", 25))  # the dashboard agent, early
    assert hooks.worker(100) == 201
    hooks._count_work(202, _work("request", 40))  # the proxy: not twice the agent's yet
    hooks._count_work(203, _work("forward", 20))  # the replica: 40, as much as the proxy
    assert hooks.worker(100, followed=201) is None
    hooks._count_work(203, _work("forward", 20))  # 80: twice the agent's and more
    assert hooks.worker(100, followed=201) == 203
    assert hooks.worker(100, followed=203) is None  # already followed


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
