"""Analyzer table tests on scripted timelines: each planted cause, healthy runs, borderlines."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.findings.data import suggest_workers
from gpudiag.analyzers.model.thresholds import Thresholds
from tests.analyzers.scenario import Scenario

HEALTHY = {"forward": 0.35, "backward": 0.45, "optimizer": 0.15, "data_wait": 0.03, "other": 0.02}


def windows(sc: Scenario, n: int = 5, **kw) -> Scenario:
    for _ in range(n):
        sc.window(**kw)
    return sc


def ids(analysis) -> list[str]:
    return [f.id for f in analysis.findings]


def test_healthy_run_has_no_findings():
    sc = windows(Scenario(), shares=HEALTHY).host(0.3).process(0.95)
    a = analyze(sc.tl)
    assert a.findings == ()
    assert a.breakdown.get("backward") == pytest.approx(0.45, abs=0.01)
    assert sum(a.breakdown.shares.values()) == pytest.approx(1.0)


def test_starved_loader_with_idle_cores_is_data001_with_worker_count():
    shares = {"data_wait": 0.6, "forward": 0.15, "backward": 0.2, "optimizer": 0.05}
    sc = windows(Scenario(cpu_count=8), shares=shares).host(0.15).process(0.9)
    a = analyze(sc.tl)
    assert ids(a) == ["DATA001"]
    f = a.findings[0]
    assert f.impact == pytest.approx(0.6, abs=0.01)
    # loading takes 1.5x the compute time: 2 workers hide it, and 8 cores have room
    assert "num_workers=2" in f.recommendation.summary
    assert f.expected_speedup == pytest.approx(2.5, rel=0.05)
    ev = {e.metric: e for e in f.evidence}
    assert ev["data_wait_share"].threshold == Thresholds().data_wait_warn
    assert ev["data_wait_share"].setting == "data_wait_warn"
    assert str(f.location) == "/work/train.py:40:train"


def test_saturated_cores_give_data002_not_more_workers():
    shares = {"data_wait": 0.5, "forward": 0.2, "backward": 0.3}
    sc = (
        windows(Scenario(cpu_count=4), shares=shares, workers=6, worker_busy=0.95, worker_io=0.0)
        .host(0.97)
        .process(0.5, workers=6, worker_cpu=3.4)
    )
    a = analyze(sc.tl)
    assert ids(a) == ["DATA002"]
    f = a.findings[0]
    assert "num_workers=3" in " ".join(f.recommendation.actions)  # 6 workers on 4 cores
    assert "Images.__getitem__" in f.message or "augment" in " ".join(f.recommendation.actions)


def test_storage_bound_pipeline_is_io001_when_io_stalls_confirm():
    shares = {"data_wait": 0.6, "forward": 0.15, "backward": 0.25}
    sc = (
        windows(Scenario(cpu_count=8), shares=shares, workers=2, worker_busy=0.9, worker_io=0.8)
        .host(0.2, iowait=0.2, psi_io=0.3)
        .process(0.4, workers=2, worker_cpu=0.3, worker_d=0.4, read_bps=400e6)
    )
    a = analyze(sc.tl)
    assert a.findings[0].id == "IO001"
    assert a.breakdown.get("storage_io") == pytest.approx(0.48, abs=0.02)
    ev = {e.metric: e for e in a.findings[0].evidence}
    assert ev["psi_io_some"].comparison == ">="
    assert ev["read_throughput"].value == pytest.approx(400.0)


def test_reads_without_io_stalls_are_not_io001():
    """Reads served from the page cache: no D-state, no PSI io, no iowait."""
    shares = {"data_wait": 0.6, "forward": 0.15, "backward": 0.25}
    sc = (
        windows(Scenario(cpu_count=8), shares=shares, workers=2, worker_busy=0.9, worker_io=0.8)
        .host(0.2)
        .process(0.4, workers=2, worker_cpu=0.3)
    )
    assert "IO001" not in ids(analyze(sc.tl))


def test_gil_contention_is_gil001_naming_the_thread():
    shares = {"forward": 0.4, "backward": 0.4, "optimizer": 0.2}
    sc = windows(Scenario(), shares=shares, gil_other=0.7).host(0.6).process(0.35)
    a = analyze(sc.tl)
    assert ids(a)[0] == "GIL001"
    f = a.findings[0]
    assert "'metrics'" in f.message and "aggregate" in f.message
    assert a.breakdown.get("gil_wait") == pytest.approx(0.65, abs=0.02)


def test_busy_background_thread_without_loop_waiting_is_not_gil001():
    """Another thread holds the GIL, but the loop thread is on-CPU: no contention cost."""
    sc = windows(Scenario(), shares=HEALTHY, gil_other=0.5).host(0.6).process(0.97)
    assert analyze(sc.tl).findings == ()


def test_checkpoint_saves_are_ckpt001_with_frequency_and_duration():
    shares = {"checkpoint": 0.3, "forward": 0.3, "backward": 0.4}
    sc = windows(Scenario(), n=5, shares=shares, saves=3).host(0.3).process(0.9)
    a = analyze(sc.tl)
    assert ids(a) == ["CKPT001"]
    f = a.findings[0]
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["saves_seen"] == 15
    assert ev["seconds_per_save"] == pytest.approx(90 * 5 / 15 / 100, rel=0.01)
    assert str(f.location) == "/work/train.py:60:save_ckpt"
    assert f.severity == "error"


@pytest.mark.parametrize("share,expected", [(0.08, []), (0.13, ["DATA001"])])
def test_data_wait_borderline_around_threshold(share, expected):
    shares = dict(HEALTHY, data_wait=share, other=0.05 - 0.03 + 0.03 - share + 0.03)
    shares["other"] = max(0.0, 1 - sum(v for k, v in shares.items() if k != "other"))
    sc = windows(Scenario(cpu_count=8), n=10, shares=shares).host(0.2).process(0.95)
    assert ids(analyze(sc.tl)) == expected


def test_too_few_samples_give_no_finding():
    shares = {"data_wait": 0.8, "forward": 0.2}
    sc = Scenario(cpu_count=8).window(shares, ticks=20).host(0.1).process(0.9)
    assert analyze(sc.tl).findings == ()  # under stack_floor_samples


def test_a_large_effect_is_found_on_fewer_than_min_loop_samples():
    shares = {"data_wait": 0.8, "forward": 0.2}
    sc = Scenario(cpu_count=8).window(shares, ticks=100).host(0.1).process(0.9)
    assert ids(analyze(sc.tl)) == ["DATA001"]


def test_threshold_override_changes_the_verdict():
    shares = {"data_wait": 0.2, "forward": 0.4, "backward": 0.4}
    sc = windows(Scenario(cpu_count=8), shares=shares).host(0.2).process(0.9)
    assert ids(analyze(sc.tl)) == ["DATA001"]
    assert analyze(sc.tl, Thresholds(data_wait_warn=0.3)).findings == ()


def test_findings_sorted_by_impact():
    shares = {"data_wait": 0.3, "checkpoint": 0.4, "forward": 0.3}
    sc = windows(Scenario(cpu_count=8), shares=shares, saves=2).host(0.2).process(0.9)
    assert ids(analyze(sc.tl)) == ["CKPT001", "DATA001"]


@pytest.mark.parametrize(
    "wait,workers,free,cores,physical,need,suggest,speed",
    [
        (0.6, 0, 7.0, 8, 4, 2, 2, 2.5),  # loading 1.5x compute: 2 workers hide it
        (0.8, 0, 0.9, 2, 2, 4, 1, 1.25),  # 2 cores, one idle: one worker, loading still paces
        (0.5, 2, 4.0, 8, 4, 4, 4, 1.5),  # 2 workers; loading scales to 3 physical cores
        (0.94, 0, 14.4, 16, 8, 16, 14, 7.4),  # the H100 starved job: 7 cores for loaders
    ],
)
def test_suggest_workers_models_the_cores_there_are(
    wait, workers, free, cores, physical, need, suggest, speed
):
    plan = suggest_workers(wait, workers, free, cores, physical)
    assert (plan.need, plan.suggest) == (need, suggest)
    assert plan.speedup == pytest.approx(speed, rel=0.02)
    assert plan.speedup <= 1 / (1 - wait) + 1e-9


def test_no_workers_on_a_busy_cpu_is_data001_graded_to_cheaper_loading():
    """num_workers=0 on a saturated 2-core box: still DATA001 (one cause, one id), its advice
    graded by the idle cores: make loading cheaper first, a bound for the speed-up."""
    shares = {"data_wait": 0.6, "forward": 0.2, "backward": 0.2}
    sc = windows(Scenario(cpu_count=2), shares=shares).host(0.95).process(1.0)
    a = analyze(sc.tl)
    assert ids(a) == ["DATA001"]
    f = a.findings[0]
    assert f.recommendation.summary.startswith("Make loading cheaper")
    assert f.speedup_basis.startswith("a bound")
    ev = {e.metric: e for e in f.evidence}
    assert ev["host_free_cores"].value == pytest.approx(0.1, abs=0.01)
    assert ev["host_free_cores"].comparison == "<"
    assert ev["physical_cores"].value == 2
    assert ev["loader_off_cpu_share"].value < Thresholds().loader_wait_min
    # whether a worker pays on a full box is what `try` measures: a candidate, no promise
    assert f.fix is not None and f.fix["values"]["num_workers"] >= 1 and f.fix["candidate"]
