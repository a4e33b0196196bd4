"""DIST001/DIST003 from per-rank summaries, DIST002 from ranks' stacks and sequence numbers."""

from __future__ import annotations

from dataclasses import replace

from gpudiag.analyzers.distributed.compare import RankStats, straggler, uses_ddp
from gpudiag.analyzers.distributed.hang import HangRank, hang_finding, is_hung, stack_collective
from gpudiag.analyzers.measures.loop import StackCount
from gpudiag.analyzers.model.thresholds import Thresholds

TH = Thresholds()
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def rank(r: int, samples: int = 200, step: float | None = 0.1, **parts: float) -> RankStats:
    full = {"data": 0.0, "compute": 0.0, "copies": 0.0, "collectives": 0.0}
    full.update(parts)
    full["other"] = max(0.0, 1.0 - sum(full.values()))
    return RankStats(
        rank=r, pid=100 + r, host="node1", gpu=str(r), parts=full, samples=samples, step_time_s=step
    )


def test_slow_loader_rank_is_named_with_its_cause_and_the_others_loss():
    ranks = [
        rank(0, compute=0.3, collectives=0.65),
        rank(1, data=0.6, compute=0.3, collectives=0.05),
        rank(2, compute=0.3, collectives=0.66),
    ]
    found, decision = straggler(ranks, TH)
    assert [f.id for f in found] == ["DIST001"]
    f = found[0]
    assert decision["straggler"] == 1
    assert "rank 1 on node1, GPU 1 is the straggler" in f.message
    assert "DataLoader" in f.message and "rank(s) 0, 2 wait for it" in f.message
    assert 0.55 < f.impact < 0.65  # what ranks 0 and 2 lose: their extra collective wait
    assert f.expected_speedup > 2.0
    assert any("num_workers" in a for a in f.recommendation.actions)


def test_slow_compute_rank_points_at_its_gpu():
    ranks = [rank(0, compute=0.9, collectives=0.05), rank(1, compute=0.45, collectives=0.5)]
    found, _ = straggler(ranks, TH)
    assert found[0].id == "DIST001" and "rank 0" in found[0].message
    assert "throttled GPU" in found[0].message


def test_balanced_ranks_are_silent():
    ranks = [rank(0, compute=0.8, collectives=0.1), rank(1, compute=0.78, collectives=0.12)]
    found, decision = straggler(ranks, TH)
    assert found == [] and decision["decided"] and decision["straggler"] is None


def test_too_few_samples_says_it_cannot_decide():
    ranks = [rank(0, samples=10, collectives=0.7), rank(1, samples=10, data=0.6)]
    found, decision = straggler(ranks, TH)
    assert found == [] and not decision["decided"]
    assert "dist_min_rank_samples" in decision["reason"]


def test_ddp_loader_straggler_is_found_from_the_wait_hidden_in_backward():
    # DDP: the all-reduce wait is inside backward (C++), no stack shows a collective; the
    # victim's compute holds the time the culprit spends on its data
    ranks = [rank(0, compute=0.95, collectives=0.02), rank(1, compute=0.25, data=0.65)]
    found, decision = straggler(ranks, TH)
    assert [f.id for f in found] == ["DIST001"] and decision["straggler"] == 1
    assert "hides under backward" in found[0].message and "DataLoader" in found[0].message


def test_ddp_hidden_wait_outweighs_a_small_visible_collective():
    # the culprit waits a little in an end-of-step broadcast; the big wait is hidden
    ranks = [
        rank(0, compute=0.9, collectives=0.005),
        rank(1, compute=0.2, data=0.65, collectives=0.12),
    ]
    found, decision = straggler(ranks, TH)
    assert decision["straggler"] == 1 and "DataLoader" in found[0].message


def test_ddp_rank_slow_in_backward_is_said_not_guessed():
    # a rank slow in its own backward makes every rank's backward long: no verdict
    ranks = [rank(0, compute=0.95, collectives=0.02), rank(1, compute=0.7, other=0.25)]
    found, decision = straggler(ranks, TH)
    assert found == [] and not decision["decided"]
    assert "DDP" in decision["reason"]


def test_every_rank_in_collectives_is_communication_bound_with_values():
    ranks = [rank(0, compute=0.4, collectives=0.55), rank(1, compute=0.42, collectives=0.5)]
    found, decision = straggler(ranks, TH)
    assert [f.id for f in found] == ["DIST003"]
    acts = " ".join(found[0].recommendation.actions)
    assert "bucket_cap_mb=100" in acts and "no_sync" in acts and "overlap_comm" in acts
    assert found[0].expected_speedup > 1.3
    assert decision["straggler"] is None


def test_hang_names_the_rank_not_in_the_collective():
    waiting = HangRank(
        rank=0,
        steps=20,
        last_step_age_s=70,
        seq=121,
        inside_op="all_reduce",
        inside_seq=121,
        stack=(f"all_reduce ({C10D}:3252)", "main (/home/u/train.py:77)"),
    )
    stuck = HangRank(
        rank=1,
        steps=20,
        last_step_age_s=71,
        seq=120,
        stack=("wait_for_file (/home/u/train.py:46)", "main (/home/u/train.py:74)"),
    )
    quiet = is_hung([waiting, stuck], TH)
    assert quiet is not None and quiet >= TH.dist_hang_s
    f = hang_finding([waiting, stuck], quiet, TH)
    assert f.id == "DIST002" and f.severity == "error"
    assert "Rank(s) 0 wait in all_reduce #121" in f.message
    assert "rank 1 is not in it" in f.message and "train.py:46:wait_for_file" in f.message
    assert "1 collective(s) behind" in f.message
    assert str(f.location) == "/home/u/train.py:46:wait_for_file"


def test_hang_from_stacks_alone_without_hooks():
    a = HangRank(rank=0, steps=5, last_step_age_s=90, stack=(f"barrier ({C10D}:10)",))
    b = HangRank(rank=1, steps=5, last_step_age_s=90, stack=("load (/u/data.py:3)",))
    assert stack_collective(a.stack) == "barrier"
    f = hang_finding([a, b], 90, TH)
    assert "wait in barrier" in f.message and "rank 1 is not in it" in f.message


def test_ranks_in_different_collectives_are_called_out_of_order():
    a = HangRank(rank=0, steps=5, last_step_age_s=90, seq=7, inside_op="all_reduce", inside_seq=7)
    b = HangRank(rank=1, steps=5, last_step_age_s=90, seq=8, inside_op="barrier", inside_seq=8)
    f = hang_finding([a, b], 90, TH)
    assert "not the same one" in f.message and "Rank(s) 0 are behind" in f.message


def test_progress_or_no_step_signal_is_not_a_hang():
    moving = [
        HangRank(rank=0, steps=5, last_step_age_s=1.0),
        HangRank(rank=1, steps=5, last_step_age_s=99),
    ]
    assert is_hung(moving, TH) is None
    no_steps = [HangRank(rank=0, steps=0, last_step_age_s=None)]
    assert is_hung(no_steps, TH) is None


def test_ddp_ranks_that_look_alike_without_hooks_are_undecided_not_balanced():
    """Attach to a DDP job whose rank 1 is slow in its own backward: every rank's backward is
    long (the others wait there, in C++) and the stacks look alike. That is not evidence of
    balance: undecided, pointing at the hooks that time the wait."""
    ranks = [
        replace(rank(0, compute=0.98, collectives=0.01), ddp=True),
        replace(rank(1, compute=0.97, collectives=0.02), ddp=True),
    ]
    found, decision = straggler(ranks, TH)
    assert found == [] and not decision["decided"]
    assert "DDP" in decision["reason"] and "gpudiag run" in decision["reason"]
    # the same shares without DDP (collectives the stacks do see): balanced
    found, decision = straggler([rank(0, compute=0.98), rank(1, compute=0.97)], TH)
    assert decision["decided"] and decision["straggler"] is None


def test_ddp_is_known_from_the_stacks_through_its_forward():
    ddp = "forward (/v/site-packages/torch/nn/parallel/distributed.py:1650);main (/u/t.py:9)"
    plain = "forward (/v/site-packages/torch/nn/modules/linear.py:125);main (/u/t.py:9)"
    assert uses_ddp({"forward": (StackCount(ddp, "", 5.0),)})
    assert not uses_ddp({"forward": (StackCount(plain, "", 5.0),)})
