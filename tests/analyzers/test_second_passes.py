"""The second passes: findings decided after the analysis, each registered by name over its one
typed input (analyzers/engine/registry.py)."""

from __future__ import annotations

from gpudiag.analyzers.distributed.passes import RanksSeen, ReportsMerged
from gpudiag.analyzers.engine.registry import CAPTURE, MERGE, RANKS, SECOND_PASSES
from gpudiag.analyzers.measures.capture import CaptureSeen
from gpudiag.analyzers.model.catalogue import new_finding
from gpudiag.analyzers.model.results import Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds


def test_every_second_pass_is_registered_once_by_name():
    assert [p.name for p in SECOND_PASSES] == ["ranks", "merge", "capture"]
    assert SECOND_PASSES == (RANKS, MERGE, CAPTURE)


def _hang(th: Thresholds):
    return new_finding(
        "DIST002",
        th,
        confidence=0.9,
        impact=1.0,
        message="hung",
        evidence=(),
        recommendation=Recommendation("look"),
        expected_speedup=1.0,
        speedup_basis="a hang has no speed-up",
    )


def test_the_ranks_pass_puts_a_hang_first_and_says_why_nothing_was_compared():
    th = Thresholds()
    passed = RANKS.run(RanksSeen([], th, _hang(th)))
    assert [f.id for f in passed.findings] == ["DIST002"]
    assert passed.part["decided"] is False


def test_the_merge_pass_drops_what_it_decides_again_and_names_the_host():
    th = Thresholds()
    mine = {"id": "DATA001", "message": "slow loader", "impact": 0.3}
    again = {"id": "DIST001", "message": "old straggler", "impact": 0.5}
    passed = MERGE.run(ReportsMerged(RanksSeen([], th), [("node-a", [mine, again])]))
    assert passed.findings == [mine]  # one host: no prefix


def test_the_capture_pass_leaves_its_input_alone():
    f = {"id": "GPU001", "evidence": [{"metric": "x"}]}
    cap = {"device": "cuda", "steps": [{"dur_s": 1.0, "idle_s": 0.5}]}
    passed = CAPTURE.run(CaptureSeen([f], cap, 0.5, Thresholds()))
    assert f == {"id": "GPU001", "evidence": [{"metric": "x"}]}
    assert "checks" in passed.part and "checks" not in cap
    assert len(passed.findings[0]["evidence"]) >= 1
