"""The rank watcher's hang check, with scripted hooks state and stack dumps."""

from __future__ import annotations

import time

from gpudiag.agent.session.ranks import hang as ranks_mod
from gpudiag.agent.session.ranks.rankset import RankSet
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.dist.collectives import CollectiveState
from gpudiag.probes.dist.ranks import RankInfo
from gpudiag.probes.inprocess.channel import HookProbe

TH = Thresholds(dist_hang_s=5.0)
C10D = "/v/site-packages/torch/distributed/distributed_c10d.py"


def rank_set(inside: dict[int, str | None], stacks: dict[int, tuple], monkeypatch) -> RankSet:
    hooks = HookProbe()
    infos = [RankInfo(r, r, 2, 900 + r, "h", None, "run:x") for r in (0, 1)]
    rs = RankSet(infos, infos[0], hooks)
    lab = hooks.labels
    old = time.monotonic() - 30
    for r in (0, 1):
        lab.steps[r], lab.last_step[r] = 50, old
        lab.states[r] = CollectiveState(
            900 + r, r, 10 + (r == 0), 10, inside[r], 11 if inside[r] else None, 20.0, old
        )
    monkeypatch.setattr(ranks_mod, "dump_main_stack", lambda pid: (stacks[pid - 900], None))
    return rs


def look_again(rs, th) -> None:
    """The next look of the hang watcher, without waiting for its recheck time."""
    rs.hang_state.recheck_at = 0.0
    rs.check_hang(th)


def confirmed(rs, th) -> None:
    """A suspected hang and the look that confirms it (the stacks have not moved)."""
    rs.check_hang(th)
    look_again(rs, th)


def test_a_rank_left_out_of_the_collective_is_a_hang_reported_once(monkeypatch):
    stacks = {0: (f"all_reduce ({C10D}:1)",), 1: ("load (/u/train.py:7)",)}
    rs = rank_set({0: "all_reduce", 1: None}, stacks, monkeypatch)
    calls = []
    rs.on_hang = lambda: calls.append(1)
    rs.check_hang(TH)
    assert calls == [] and rs.hang_finding is None  # suspected: confirmed by a second look
    look_again(rs, TH)
    look_again(rs, TH)
    assert calls == [1]
    assert rs.hang_finding is not None and "rank 1 is not in it" in rs.hang_finding.message
    assert rs.hang["stacks"]["1"] == ["load (/u/train.py:7)"]


def test_a_long_evaluation_without_collectives_is_not_a_hang(monkeypatch):
    stacks = {0: ("evaluate (/u/train.py:30)",), 1: ("evaluate (/u/train.py:30)",)}
    rs = rank_set({0: None, 1: None}, stacks, monkeypatch)
    rs.on_hang = lambda: (_ for _ in ()).throw(AssertionError("reported"))
    rs.check_hang(TH)
    assert rs.hang_finding is None and "not reported as a hang" in rs.notes[-1]


def test_a_job_whose_stacks_move_between_two_looks_is_not_hung(monkeypatch):
    """The hooks' events can lag a busy box: a rank shown inside a barrier it has left while
    both ranks already train again. The confirming look sees other frames: no hang."""
    stacks = {0: (f"all_reduce ({C10D}:1)",), 1: ("load (/u/train.py:7)",)}
    rs = rank_set({0: "all_reduce", 1: None}, stacks, monkeypatch)
    rs.check_hang(TH)
    stacks[1] = ("SlowGrad.backward (/u/train.py:57)", "main (/u/train.py:122)")
    look_again(rs, TH)
    assert rs.hang_finding is None  # it moved: the suspicion starts over
    look_again(rs, TH)
    assert rs.hang_finding is not None  # the same stacks twice: now it is a hang


def test_the_suspecting_look_comes_early_so_the_hang_is_named_at_the_threshold(monkeypatch):
    """The first look is CONFIRM_S before dist_hang_s: the confirming one, at the threshold,
    names the hang then (not a look later); before that neither look reports anything."""
    stacks = {0: (f"all_reduce ({C10D}:1)",), 1: ("load (/u/train.py:7)",)}
    rs = rank_set({0: "all_reduce", 1: None}, stacks, monkeypatch)
    lab = rs.hooks.labels
    dumps = []
    monkeypatch.setattr(
        ranks_mod, "dump_main_stack", lambda pid: dumps.append(pid) or (stacks[pid - 900], None)
    )

    def quiet_for(seconds: float) -> None:
        for r in (0, 1):
            lab.last_step[r] = time.monotonic() - seconds

    quiet_for(TH.dist_hang_s - ranks_mod.CONFIRM_S - 1.0)
    rs.check_hang(TH)
    assert dumps == []  # not even suspected yet
    quiet_for(TH.dist_hang_s - 1.0)
    rs.check_hang(TH)
    assert rs.hang_state.suspect is not None and rs.hang_finding is None
    assert rs.hang_state.recheck_at >= time.monotonic() + 0.9  # the next look at the threshold
    quiet_for(TH.dist_hang_s + 0.1)
    look_again(rs, TH)
    assert rs.hang_finding is not None and rs.hang["seconds_without_step"] < TH.dist_hang_s + 1
