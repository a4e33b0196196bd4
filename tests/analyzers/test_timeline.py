"""The timeline stays bounded however long the run, and aggregates correctly."""

from __future__ import annotations

from gpudiag.analyzers.timeline.timeline import OTHER_STACKS, Timeline
from gpudiag.probes.base import Sample


def test_rollup_statistics():
    tl = Timeline()
    for i, v in enumerate([1.0, 3.0, None, 2.0]):
        tl.add(Sample("host", i * 10**9, {}, {"cpu_util": v}))
    r = tl.rollup("host", "cpu_util")
    assert (r.count, r.mean, r.minimum, r.maximum, r.last) == (3, 2.0, 1.0, 3.0, 2.0)
    assert tl.duration_s == 3.0


def test_memory_is_bounded_for_endless_series_threads_and_stacks():
    tl = Timeline(max_series=50, max_threads=5, max_stacks_per_thread=20)
    for i in range(5000):
        tl.add(Sample("process", i, {"scope": "thread", "tid": str(i)}, {"cpu": 0.5}))
        tl.add(
            Sample(
                "stacks",
                i,
                {
                    "mode": "all",
                    "kind": "stack",
                    "role": "target",
                    "tid": str(i % 7),
                    "thread": "t",
                    "stack": f"f{i} (/a.py:1)",
                },
                {"count": 1},
            )
        )
    assert len(tl.series) == 50
    assert tl.dropped > 0
    assert len(tl.stacks) <= 6  # 5 threads + the overflow bucket
    assert all(len(t) <= 21 for t in tl.stacks.values())
    assert sum(sum(t.values()) for t in tl.stacks.values()) == 5000  # nothing lost, only merged
    assert any((OTHER_STACKS, "") in t for t in tl.stacks.values())


def test_worker_stacks_merge_across_worker_pids():
    tl = Timeline()
    for pid in range(100):  # workers re-created every epoch
        tl.add(
            Sample(
                "stacks",
                pid,
                {
                    "mode": "all",
                    "kind": "stack",
                    "role": "worker",
                    "pid": str(pid),
                    "tid": str(pid),
                    "thread": "MainThread",
                    "stack": "w (/a.py:1)",
                },
                {"count": 2},
            )
        )
    keys = tl.threads("all", "worker")
    assert len(keys) == 1 and tl.stacks[keys[0]][("w (/a.py:1)", "")] == 200
    assert len(tl.worker_pids) == 100


def test_segments_stay_bounded_and_a_window_selects_a_span():
    tl = Timeline(segment_s=1.0, max_segments=16)
    for i in range(1000):  # 1000 s of one sample per second: 0.0 for 500 s, then 1.0
        tl.add(Sample("gpu", i * 10**9, {"gpu": "0"}, {"util_gpu": 0.0 if i < 500 else 1.0}))
    assert len(tl.segments) <= 16
    assert tl.mean("gpu", "util_gpu", gpu="0") == 0.5
    late = tl.window(600 * 10**9, None)
    early = tl.window(None, 400 * 10**9)
    assert late.mean("gpu", "util_gpu", gpu="0") == 1.0
    assert early.mean("gpu", "util_gpu", gpu="0") == 0.0
    r = tl.rollup("gpu", "util_gpu", gpu="0")
    assert (r.first_ns, r.last_ns, r.last) == (0, 999 * 10**9, 1.0)


def test_a_job_healthy_then_starved_reports_both_periods():
    """Half the run healthy, half waiting on data: the report says when it changed."""
    from gpudiag.analyzers import analyze
    from gpudiag.analyzers.model.thresholds import Thresholds
    from tests.analyzers.scenario import Scenario

    healthy = {"forward": 0.35, "backward": 0.45, "optimizer": 0.15, "other": 0.05}
    starved = {"data_wait": 0.7, "forward": 0.1, "backward": 0.15, "optimizer": 0.05}
    sc = Scenario(cpu_count=8)
    for shares in (healthy, starved):
        for _ in range(20):
            sc.window(shares)
    sc.host(0.2, n=120).process(0.9, n=120)
    a = analyze(sc.tl, Thresholds(period_s=30.0))
    tops = [p["finding"] for p in a.periods]
    assert len(tops) == 4
    assert tops[:2] == [None, None] and tops[2:] == ["DATA001", "DATA001"]
    assert a.findings[0].id == "DATA001"  # the whole loop: half of it starved


def test_window_totals_match_the_whole_run_without_merging_it():
    tl = Timeline(max_segments=4)
    for i in range(20):
        tl.add(
            Sample(
                "stacks",
                i * 3 * 10**9,
                {"mode": "all", "kind": "window"},
                {"ticks": 300.0, "duration_s": 3.0, "rate_hz": 100.0, "errors": 0.0},
            )
        )
    w = tl.window_totals("all")
    assert (
        (w.windows, w.ticks) == (20, 6000.0) == (tl.windows["all"].windows, tl.windows["all"].ticks)
    )
    assert tl.window_totals("gil") is None


def test_a_nan_value_is_left_out_instead_of_poisoning_the_mean():
    """An H100's first GPM pair gave DRAM bandwidth NaN: the mean must stay a number."""
    from gpudiag.probes.base import Sample

    tl = Timeline()
    tl.extend(
        [
            Sample("gpu", 1, {"gpu": "0"}, {"gpm_dram_bw": float("nan")}),
            Sample("gpu", 2, {"gpu": "0"}, {"gpm_dram_bw": 0.5}),
        ]
    )
    assert tl.mean("gpu", "gpm_dram_bw", gpu="0") == 0.5
