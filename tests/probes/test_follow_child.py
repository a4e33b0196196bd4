"""A server under a supervisor (Werkzeug's reloader, uvicorn's and gunicorn's): the hooks say
which process does the work, and the stacks follow it there from the target that only waits."""

from __future__ import annotations

from gpudiag.probes.base import Sample
from gpudiag.probes.inprocess.channel import HookProbe


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
