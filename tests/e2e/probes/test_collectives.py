"""End to end: the collective hooks' datagrams: samples, each rank's latest state, rank labels."""

from __future__ import annotations

import pytest

from gpudiag.probes.inprocess.channel import HookProbe

JOB = r"""
import os, sys, time, tempfile
import torch, torch.distributed as dist
f = tempfile.NamedTemporaryFile(delete=False)
dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
w = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(w.parameters(), lr=0.1)
for _ in range(3):
    w(torch.ones(4)).sum().backward()
    dist.all_reduce(w.weight.grad)
    opt.step()
dist.barrier()
time.sleep(1.2)  # the sender's turn
dist.destroy_process_group()
"""


def test_hooks_count_a_real_jobs_collectives_with_sequence_numbers(tmp_path):
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    from gpudiag.probes.base import Target
    from gpudiag.probes.inprocess.channel import injection_env

    probe = HookProbe()
    assert probe.open(Target(0)).available
    try:
        env = injection_env(dict(os.environ), probe.path or "")
        res = subprocess.run([sys.executable, "-c", JOB], env=env, capture_output=True, timeout=120)
        assert res.returncode == 0, res.stderr.decode()[-2000:]
        samples = probe.sample()
    finally:
        probe.close()
    ops = {}
    for s in samples:
        if s.labels.get("kind") == "collective_op":
            ops[s.labels["op"]] = s.values["calls"]  # the latest totals win
    assert ops == {"all_reduce": 3.0, "barrier": 1.0}
    kinds = ("collective_step", "collective_first_step")  # the first: start-up, apart
    steps = [s for s in samples if s.labels.get("kind") in kinds]
    assert [s.values["seq"] for s in steps] == [1.0, 2.0, 3.0]
    assert [s.labels["kind"] for s in steps] == ["collective_first_step", *kinds[:1] * 2]
    assert all(s.values["collective_step_s"] > 0 for s in steps[1:])
    assert all(s.values["collectives"] == 1.0 for s in steps)
