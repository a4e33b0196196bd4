"""GIL001 from its direct signals: the loop thread's schedstat and who holds the GIL.

A loop starved of the GIL sits off-CPU in a futex, so py-spy takes few stacks of it and a
budget-lowered rate gives fewer still: GIL001 must not wait for min_loop_samples stacks.
"""

from __future__ import annotations

from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.thresholds import Thresholds
from tests.analyzers.scenario import Scenario

LOOP = {"forward": 0.35, "backward": 0.45, "optimizer": 0.2}


def test_few_loop_samples_still_give_gil001_from_schedstat_and_gil_ticks():
    # 2 windows x 20 = 40 loop stack samples (of 150), 2 x 5 = 10 --gil ticks at 25 Hz...
    sc = Scenario()
    for _ in range(2):
        sc.window(LOOP, ticks=20, gil_other=0.0)
    # ...and a --gil recorder with its own ticks: 2 windows of 40 ticks, others 30%
    for _ in range(2):
        sc._add(
            "stacks",
            {
                "mode": "gil",
                "kind": "stack",
                "pid": "100",
                "tid": "101",
                "thread": "metrics",
                "role": "target",
                "stack": "Thread.run (/usr/lib/python3.11/threading.py:982);"
                "aggregate (/work/metrics.py:9)",
                "code": "",
            },
            {"count": 12},
        )
        sc._add(
            "stacks",
            {"mode": "gil", "kind": "window"},
            {"ticks": 40, "duration_s": 3.0, "rate_hz": 13.0, "errors": 0},
        )
    sc.host(0.9).process(0.3)
    a = analyze(sc.tl)
    assert a.profile.samples < Thresholds().min_loop_samples
    assert [f.id for f in a.findings][:1] == ["GIL001"]
    f = a.findings[0]
    ev = {e.metric: e for e in f.evidence}
    assert ev["gil_ticks"].setting == "gil_min_ticks"
    assert ev["loop_thread_schedstat_readings"].setting == "gil_min_readings"
    # the wait is the loop's unexplained off-CPU time, not the holders' undercounted share
    assert f.impact >= 0.6
    # the verdict may be sure on those signals alone (attach: no timed steps)
    assert a.verdict["finding"] == "GIL001"
    assert not a.verdict["statement"].startswith("not sure yet")


def test_few_gil_ticks_and_few_stacks_is_no_gil001():
    """Too little of either signal: no GIL001 (thin evidence is not a verdict)."""
    sc = Scenario()
    sc.window(LOOP, ticks=20, gil_other=0.6)  # 5 --gil ticks
    sc.host(0.9).process(0.3, n=2)
    assert "GIL001" not in [f.id for f in analyze(sc.tl).findings]


def test_helpers_that_sleep_or_release_the_gil_are_not_gil001():
    """The loop is off-CPU (a busy box) but no other thread holds the GIL."""
    sc = Scenario()
    for _ in range(5):
        sc.window(LOOP, gil_other=0.02)
    sc.host(0.9).process(0.4)
    a = analyze(sc.tl)
    assert "GIL001" not in [f.id for f in a.findings]
    assert a.breakdown.get("gil_wait") <= 0.03
