"""The timing DDP communication hook: DDP's gradient all-reduce (C++ reducer, under
`backward`) counted and timed per step with sequence numbers, and a user's own hook wrapped."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.inprocess.channel import HookProbe, injection_env

JOB = """
import os, time, torch, torch.distributed as dist
from torch import nn
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
if os.environ.get("USER_HOOK"):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    def my_hook(state, bucket):
        return allreduce_hook(state, bucket)
    model.register_comm_hook(None, my_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = []
for i in range(3):
    out = model(torch.randn(4, 8))
    if os.environ.get("LATE_HOOK") and i == 1:  # after the first forward: ours is there
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        def late_hook(state, bucket):
            calls.append(1)
            return allreduce_hook(state, bucket)
        model.register_comm_hook(None, late_hook)
    out.sum().backward()
    opt.step()
assert calls == ([1, 1] if os.environ.get("LATE_HOOK") else []), calls
time.sleep(1.2)  # the sender's turn
dist.destroy_process_group()
"""


def run_job(extra: dict[str, str]) -> tuple[dict[str, float], list, list]:
    pytest.importorskip("torch")
    probe = HookProbe()
    assert probe.open(Target(0)).available
    probe.labels.enabled = True  # keep each rank's collective state
    try:
        env = {**injection_env(dict(os.environ), probe.path or ""), **extra}
        env.update(RANK="0", WORLD_SIZE="1")
        res = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, timeout=120)
        assert res.returncode == 0, res.stderr.decode()[-2000:]
        samples = probe.sample()
        states = list(probe.labels.states.values())
    finally:
        probe.close()
    ops = {}
    for s in samples:
        if s.labels.get("kind") == "collective_op":
            ops[s.labels["op"]] = s.values["calls"]
    # the first step comes apart (its length includes start-up), the others as steps
    steps = [
        s for s in samples if s.labels.get("kind") in ("collective_first_step", "collective_step")
    ]
    return ops, steps, states


def test_ddp_gradient_allreduce_is_timed_by_a_comm_hook():
    ops, steps, states = run_job({})
    assert ops.get("ddp_allreduce") == 3.0, ops  # one bucket per step, seen from Python
    assert [s.values["seq"] for s in steps] == [1.0, 2.0, 3.0]
    assert all(s.values["collective_s"] > 0 for s in steps)
    assert states and "default all-reduce" in (states[0].ddp_hook or "")


def test_a_users_own_comm_hook_is_wrapped_and_still_timed():
    ops, steps, states = run_job({"USER_HOOK": "1"})
    assert ops.get("ddp_allreduce") == 3.0, ops
    assert len(steps) == 3
    assert states and "user: " in (states[0].ddp_hook or "") and "my_hook" in states[0].ddp_hook


def test_a_hook_registered_after_the_first_forward_replaces_the_default_and_is_timed():
    ops, steps, states = run_job({"LATE_HOOK": "1"})  # the job asserts its hook ran twice
    assert ops.get("ddp_allreduce") == 3.0, ops
    assert "late_hook" in (states[0].ddp_hook or "")
