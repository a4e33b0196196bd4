"""DIST001/DIST003 from the waits the collective hooks measured (DDP's comm hook included):
the culprit outside forward/backward/optimizer, in its DataLoader or in its own backward, each
named with its cause, location and the victims' loss; balanced and ambiguous cases not."""

from __future__ import annotations

from gpudiag.analyzers.distributed.compare import RankStats, adjusted_parts, straggler
from gpudiag.analyzers.model.thresholds import Thresholds

TH = Thresholds()


def rank(r: int, wait: float | None, steps: int = 100, samples: int = 200, **parts) -> RankStats:
    full = {"data": 0.0, "compute": 0.0, "copies": 0.0, "collectives": 0.0, "checkpoint": 0.0}
    full.update(parts)
    full["other"] = max(0.0, 1.0 - sum(full.values()))
    locs = {"other": "/u/train.py:30:main", "data": "/u/data.py:12:__getitem__"}
    return RankStats(
        rank=r,
        pid=100 + r,
        host="node1",
        parts=full,
        samples=samples,
        steps=steps,
        step_time_s=0.1,
        collective_share_hooks=wait,
        locations=locs,
    )


def test_the_issue_case_rank_slow_in_its_own_loop_is_named():
    # DDP: rank 0's wait is under backward (compute 99%), rank 1 spends 90% in its loop
    ranks = [rank(0, 0.62, compute=0.99), rank(1, 0.04, compute=0.1)]
    found, decision = straggler(ranks, TH)
    assert decision["decided"] and decision["straggler"] == 1, decision
    f = found[0]
    assert f.id == "DIST001" and "rank 1 on node1 is the straggler" in f.message
    assert "own loop work" in f.message and "/u/train.py:30:main" in f.message
    assert "58 ms of every 100 ms step" in f.message and "hidden under their backward" in f.message
    assert str(f.location) == "/u/train.py:30:main"
    assert 2.3 < f.expected_speedup < 2.5
    assert any(e.setting == "dist_straggler_gap" and e.source == "hooks" for e in f.evidence)


def test_slow_loader_rank_is_named_from_measured_waits():
    ranks = [rank(0, 0.6, compute=0.95), rank(1, 0.05, data=0.6, compute=0.35)]
    found, decision = straggler(ranks, TH)
    assert decision["straggler"] == 1 and "DataLoader" in found[0].message
    assert "/u/data.py:12:__getitem__" in found[0].message


def test_rank_slow_in_its_own_backward_is_named_once_the_wait_is_moved_out():
    # stacks alone: both ranks look ~all compute; the measured wait tells them apart
    ranks = [rank(0, 0.6, compute=0.97), rank(1, 0.05, compute=0.95)]
    assert adjusted_parts(ranks[0])["compute"] < 0.4
    found, decision = straggler(ranks, TH)
    assert decision["straggler"] == 1 and "its own compute is slower" in found[0].message


def test_balanced_measured_ranks_are_silent():
    ranks = [rank(0, 0.08, compute=0.9), rank(1, 0.06, compute=0.9)]
    found, decision = straggler(ranks, TH)
    assert found == [] and decision["decided"] and decision["straggler"] is None


def test_waits_that_do_not_separate_are_undecided_with_three_ranks():
    ranks = [rank(0, 0.5, compute=0.9), rank(1, 0.05, compute=0.9), rank(2, 0.1, compute=0.9)]
    found, decision = straggler(ranks, TH)
    assert found == [] and not decision["decided"] and "no single straggler" in decision["reason"]


def test_too_few_stack_samples_names_the_culprit_but_not_its_cause():
    ranks = [rank(0, 0.6, samples=10, compute=0.99), rank(1, 0.05, samples=10, compute=0.1)]
    found, decision = straggler(ranks, TH)
    assert decision["straggler"] == 1 and "not named" in found[0].message


def test_too_few_timed_steps_falls_back_to_the_stacks():
    ranks = [rank(0, 0.62, steps=3, compute=0.99), rank(1, 0.04, steps=3, compute=0.1)]
    _, decision = straggler(ranks, TH)
    assert "basis" not in decision or "measured" not in decision.get("basis", "")


def test_every_rank_waiting_long_is_communication_bound():
    ranks = [rank(0, 0.45, compute=0.5), rank(1, 0.42, compute=0.5)]
    found, decision = straggler(ranks, TH)
    assert [f.id for f in found] == ["DIST003"] and decision["straggler"] is None


def test_without_hooks_the_loop_straggler_is_inferred_when_its_work_is_in_user_code():
    # attach without instrument(): no measured wait; rank 1's own loop work has a user frame
    ranks = [rank(0, None, steps=0, compute=0.99), rank(1, None, steps=0, compute=0.1)]
    found, decision = straggler(ranks, TH)
    assert decision["straggler"] == 1 and "/u/train.py:30:main" in found[0].message
    assert "inferred" in found[0].message
