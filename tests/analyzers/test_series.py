"""The run over time and the loop thread's stacks: bounded whatever the run's length."""

from __future__ import annotations

from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.analyzers.measures.series import MAX_POINTS, MAX_STACKS, loop_stacks, run_series
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import Sample
from tests.analyzers.scenario import STACKS

S = 1_000_000_000


def long_run(seconds: int, starved_after: int) -> Timeline:
    """One GPU at 90% then 20%; the loop thread in forward, then waiting for data."""
    tl = Timeline()
    for t in range(seconds):
        starved = t >= starved_after
        tl.add(
            Sample(
                "gpu", t * S, {"gpu": "0", "name": "H100"}, {"util_gpu": 0.2 if starved else 0.9}
            )
        )
        tl.add(
            Sample("hooks", t * S + 1, {"kind": "step"}, {"step_time_s": 0.5 if starved else 0.1})
        )
        if t % 3 == 2:
            cat = "data_wait" if starved else "forward"
            labels = {
                "kind": "stack",
                "mode": "all",
                "role": "target",
                "tid": "7",
                "thread": "MainThread",
                "stack": STACKS[cat],
                "code": "",
            }
            tl.add(Sample("stacks", t * S + 2, labels, {"count": 300.0}))
    return tl


def test_a_day_long_run_stays_within_its_points_and_shows_when_it_changed():
    tl = long_run(4000, 3000)  # more segments than the timeline keeps: coarsened
    series = run_series(tl, Classifier())
    pts = series["points"]
    assert len(pts) <= MAX_POINTS
    early, late = pts[len(pts) // 4], pts[-len(pts) // 8]
    assert early["gpu_util"]["0"] > 0.8 and late["gpu_util"]["0"] < 0.3
    assert early["phases"].get("forward", 0) > 0.9 and late["phases"].get("data_wait", 0) > 0.9
    assert early["step_time_s"] < late["step_time_s"]
    assert sum(p["steps"] for p in pts) == 4000
    assert series["thread"] == "MainThread (tid 7)"


def test_loop_stacks_keep_the_most_sampled_and_count_the_rest():
    tl = long_run(30, 15)
    for i in range(MAX_STACKS + 30):  # many rare stacks
        labels = {
            "kind": "stack",
            "mode": "all",
            "role": "target",
            "tid": "7",
            "thread": "MainThread",
            "stack": f"{STACKS['other']};f{i} (/work/x.py:{i})",
            "code": "",
        }
        tl.add(Sample("stacks", 20 * S, labels, {"count": 1.0}))
    st = loop_stacks(tl, Classifier())
    assert len(st["stacks"]) == MAX_STACKS + 1
    assert (
        st["stacks"][-1]["category"] == "other"
        and st["frames"][st["stacks"][-1]["frames"][0]] == "(other stacks)"
    )
    assert st["samples"] == sum(s["count"] for s in st["stacks"])
    assert st["stacks"][0]["category"] in ("forward", "data_wait")


def test_empty_timeline_gives_empty_views():
    assert run_series(Timeline(), Classifier())["points"] == []
    assert loop_stacks(Timeline(), Classifier())["stacks"] == []
