"""The hang watcher beyond the basics: DDP's all-reduce under backward, a phase (evaluation,
save) outside the collective, the threshold scaled by the job's own steps, the NCCL flight
recorder's dumps merged in, with scripted hooks state, stacks and dump files."""

from __future__ import annotations

import pickle

from gpudiag.agent.session.ranks import hang as rank_hang
from gpudiag.analyzers.model.thresholds import Thresholds
from tests.agent.test_rank_watch import C10D, confirmed, look_again, rank_set
from tests.probes.test_flight_recorder import dump, entry

TH = Thresholds(dist_hang_s=5.0)  # the ranks' last step was 30 s ago
BACKWARD = (
    "_engine_run_backward (/v/site-packages/torch/autograd/graph.py:9)",
    "Tensor.backward (/v/site-packages/torch/_tensor.py:6)",
    "main (/u/train.py:40)",
)


def test_ddp_rank_blocked_in_its_gradient_allreduce_is_a_hang(monkeypatch):
    stacks = {0: BACKWARD, 1: ("stalled (/u/train.py:22)", "main (/u/train.py:35)")}
    rs = rank_set({0: "ddp_allreduce", 1: None}, stacks, monkeypatch)
    confirmed(rs, TH)
    f = rs.hang_finding
    assert f is not None, rs.notes
    assert "DDP's gradient all-reduce" in f.message and "rank 1 is not in it" in f.message
    assert "/u/train.py:22:stalled" in f.message
    assert {e.setting for e in f.evidence} >= {"dist_hang_s", "dist_hang_steps"}


def test_a_rank_evaluating_while_the_others_wait_in_a_barrier_is_not_a_hang(monkeypatch):
    stacks = {
        0: ("evaluate (/u/train.py:60)", "main (/u/train.py:90)"),
        1: (f"barrier ({C10D}:1)",),
    }
    rs = rank_set({0: None, 1: "barrier"}, stacks, monkeypatch)
    rs.check_hang(Thresholds(dist_hang_s=10.0))  # quiet 30 s < 5 x 10 s
    assert rs.hang_finding is None
    assert "rank 0 is evaluating at /u/train.py:60:evaluate" in rs.notes[-1], rs.notes
    # the same stacks past dist_hang_steps times the threshold: a hang after all
    rs.hang_state.recheck_at = 0.0
    confirmed(rs, Thresholds(dist_hang_s=10.0, dist_hang_steps=2))  # 30 s >= 2 x 10 s
    assert rs.hang_finding is not None and "rank 0 is not in it" in rs.hang_finding.message


def test_a_save_outside_the_collective_is_a_phase_too(monkeypatch):
    ser = "save (/v/site-packages/torch/serialization.py:900)"
    stacks = {0: (ser, "main (/u/train.py:70)"), 1: (f"barrier ({C10D}:1)",)}
    rs = rank_set({0: None, 1: "barrier"}, stacks, monkeypatch)
    rs.check_hang(Thresholds(dist_hang_s=10.0))
    assert rs.hang_finding is None and "rank 0 is saving" in rs.notes[-1]


def test_the_threshold_scales_with_the_jobs_longest_step(monkeypatch):
    stacks = {0: (f"all_reduce ({C10D}:1)",), 1: ("load (/u/train.py:7)",)}
    rs = rank_set({0: "all_reduce", 1: None}, stacks, monkeypatch)
    rs.hooks.labels.longest[0] = 8.0  # an 8 s step before: 5 x 8 = 40 s > 30 s quiet
    rs.check_hang(TH)
    assert rs.hang_finding is None
    rs.hooks.labels.longest[0] = 2.0  # 5 x 2 = 10 s < 30 s
    look_again(rs, TH)
    look_again(rs, TH)
    f = rs.hang_finding
    assert f is not None
    quiet = next(e for e in f.evidence if e.metric == "seconds_without_step")
    assert quiet.threshold == 10.0 and quiet.setting == "dist_hang_steps"


def write(tmp_path, per_rank: dict[int, list[dict]]) -> str:
    for rank, entries in per_rank.items():
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump(entries)))
    return str(tmp_path / "nccl_trace_rank_")


def test_flight_recorder_dump_names_the_rank_behind_while_hung(monkeypatch, tmp_path):
    # NCCL with a builtin DDP hook: no hooks state, the stacks show only backward
    stacks = {0: BACKWARD, 1: ("stalled (/u/train.py:22)", "main (/u/train.py:35)")}
    rs = rank_set({0: None, 1: None}, stacks, monkeypatch)
    monkeypatch.setattr(rank_hang, "read_environ", lambda pid: {})
    rs.hang_state.fr_prefix = write(
        tmp_path,
        {
            0: [entry(11, "completed"), entry(12, "started")],
            1: [entry(11, "completed")],
        },
    )
    confirmed(rs, TH)
    f = rs.hang_finding
    assert f is not None, rs.notes
    assert "Rank(s) 0 wait in nccl:all_reduce #12 (flight recorder)" in f.message, f.message
    assert "rank 1 is not in it" in f.message and "its last collective was #11" in f.message
    assert "NCCL flight recorder: rank 0 last entered #12" in f.message
    assert rs.hang["flight_recorder"]["1"]["last_completed"] == [11, "nccl:all_reduce"]


def test_dumps_after_a_watchdog_timeout_give_dist002_at_the_end(monkeypatch, tmp_path):
    stacks = {0: (), 1: ()}
    rs = rank_set({0: None, 1: None}, stacks, monkeypatch)
    monkeypatch.setattr(rank_hang, "read_environ", lambda pid: {})
    rs.hang_state.fr_prefix = write(
        tmp_path, {0: [entry(7, "started")], 1: [entry(6, "completed")]}
    )
    rank_hang.recorder_hang(rs, TH)
    f = rs.hang_finding
    assert f is not None and "NCCL watchdog timeout" in f.message
    assert "rank 1 is not in it" in f.message
    assert not any(e.metric == "seconds_without_step" for e in f.evidence)


def test_no_dumps_no_recorder_finding(monkeypatch, tmp_path):
    rs = rank_set({0: None, 1: None}, {0: (), 1: ()}, monkeypatch)
    monkeypatch.setattr(rank_hang, "read_environ", lambda pid: {})
    rs.hang_state.fr_prefix = str(tmp_path / "none_")
    rank_hang.recorder_hang(rs, TH)
    assert rs.hang_finding is None
