"""A session is built complete: its probes made in one place, a multi-rank job's rank probes
before the budget governor (so that they get its CPU goal), nothing set on it afterwards."""

from __future__ import annotations

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.session.ranks.rankset import RankStackProbe
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts, make_probes
from gpudiag.probes.base import Target
from gpudiag.probes.dist.ranks import RankInfo
from gpudiag.probes.inprocess.channel import HookProbe
from gpudiag.probes.stacks.probe import StackProbe


def ranks(n: int) -> list[RankInfo]:
    return [RankInfo(r, r, n, 9000 + r, "h", None, "run:x") for r in range(n)]


def test_every_ranks_stack_probe_gets_the_governors_cpu_goal():
    opts = SessionOptions(cpu_budget=0.05, rate_hz=100)
    s = Session(Target(9000), load_settings(None), opts, SessionParts(ranks=(ranks(3), 1)))
    stacks = [p for p in s.probes if isinstance(p, StackProbe)]
    assert len(stacks) == 3 and sum(isinstance(p, RankStackProbe) for p in stacks) == 2
    assert s.governor is not None and all(p.cpu_goal for p in stacks)
    assert {p.cpu_goal for p in stacks} == {stacks[0].cpu_goal}
    assert all(p.rate_hz == 33 for p in stacks)  # the rate split between the three ranks
    assert s.ranks is not None and s.ranks.add_probe is not None


def test_the_probe_list_is_made_in_one_place_with_the_options():
    opts = SessionOptions(attached=True, stacks_min_rate_hz=1, rate_hz=50, capture_steps=4)
    hooks = HookProbe()
    probes = make_probes(opts, hooks)
    names = ["host", "process", "stacks", "gpu", "triton", "conns", "hooks"]
    assert [p.name for p in probes] == names
    stacks = probes[2]
    assert stacks.startup_timeout_s == 0.0 and stacks.min_rate_hz == 1
    s = Session(Target(1), load_settings(None), opts, SessionParts(hooks=hooks))
    assert s.probes[-1] is hooks and s.capture_steps == 4
    assert make_probes(SessionOptions())[2].startup_timeout_s > 0  # run: waits for py-spy


def test_a_hang_callback_is_given_the_session():
    seen = []
    opts = SessionOptions()
    parts = SessionParts(ranks=(ranks(2), 1), on_hang=seen.append)
    s = Session(Target(9000), load_settings(None), opts, parts)
    s.ranks.on_hang()
    assert seen == [s]
