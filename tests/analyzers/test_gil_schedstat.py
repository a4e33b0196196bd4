"""GIL001 from schedstat alone: the other Python threads' CPU and the loop thread's time not
running, measured on the held-out metrics-aggregator job (2 cores, idle box):

- one aggregator thread: loop on-CPU 52%, run-queue 40%, off-CPU 6%; aggregator 47% of a
  core; the intra-op pool spins on the other core (the GIL wait is run-queue time there);
- three aggregator threads: loop on-CPU 5%, off-CPU 84%, three aggregators 0.31 core each,
  while the job was still importing lazily in its first step (no loop stack at all).
"""

from __future__ import annotations

from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.catalogue import ranked
from gpudiag.analyzers.model.results import Finding, Recommendation
from tests.analyzers.scenario import STD, Scenario

LOOP = {"forward": 0.25, "backward": 0.6, "optimizer": 0.1, "other": 0.05}
IMPORTING = (
    "<module> (/work/train.py:30);_find_and_load (<frozen importlib._bootstrap>:1176)"
    f";_load_unlocked (<frozen importlib._bootstrap>:690);get_data ({STD}/importlib/x.py:1)"
)


def _job(loop_cpu: float, loop_rq: float, others: float | None = None, windows: int = 3):
    sc = Scenario(cpu_count=2)
    for _ in range(windows):
        sc.window(LOOP, ticks=60)  # 3 s windows, no --gil holder ticks
    sc.host(0.99).process(loop_cpu, loop_rq=loop_rq)
    if others is not None:
        sc.others({("4242", "burner"): others})
    return sc


def test_other_python_threads_cpu_names_the_gil_holder_without_gil_ticks():
    sc = _job(loop_cpu=0.15, loop_rq=0.05)
    sc.python_thread(101, "metrics-0", cpu=0.8)
    a = analyze(sc.tl)
    f = next(f for f in a.findings if f.id == "GIL001")
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["other_python_threads_cpu"] == 0.8
    assert "'metrics-0'" in f.message
    assert f.impact >= 0.6  # off-CPU 80%, nothing blocking explains it
    assert a.verdict["finding"] == "GIL001"


def test_gil_wait_seen_as_runqueue_time_on_an_idle_box_is_gil001():
    sc = _job(loop_cpu=0.52, loop_rq=0.40, others=0.0)
    sc.python_thread(101, "metrics-0", cpu=0.47)
    a = analyze(sc.tl)
    f = next(f for f in a.findings if f.id == "GIL001")
    assert 0.4 <= f.impact <= 0.5
    assert {e.metric for e in f.evidence} >= {
        "loop_thread_runqueue_wait",
        "gil_held_by_other_threads",
    }


def test_runqueue_time_that_other_processes_explain_is_not_gil_wait():
    sc = _job(loop_cpu=0.52, loop_rq=0.40, others=1.0)
    sc.python_thread(101, "metrics-0", cpu=0.47)
    a = analyze(sc.tl)
    gil = [f for f in a.findings if f.id == "GIL001"]
    assert not gil or gil[0].impact < 0.15
    assert "HOST002" in [f.id for f in a.findings]


def test_a_quiet_helper_thread_is_not_gil001():
    """A logging or pin-memory thread using 5% of a core holds the GIL too little to name."""
    sc = _job(loop_cpu=0.6, loop_rq=0.35, others=0.0)
    sc.python_thread(101, "pin_memory", cpu=0.05)
    assert "GIL001" not in [f.id for f in analyze(sc.tl).findings]


def test_a_look_that_saw_only_start_up_still_names_the_gil():
    sc = Scenario(cpu_count=2)
    for _ in range(3):
        sc._add(
            "stacks",
            {
                "mode": "all",
                "kind": "stack",
                "pid": "100",
                "tid": "100",
                "thread": "MainThread",
                "role": "target",
                "stack": IMPORTING,
                "code": "",
            },
            {"count": 50},
        )
        sc.t += 3_000_000_000
        sc._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {"ticks": 50, "duration_s": 3.0, "rate_hz": 17.0, "errors": 0},
        )
    sc.host(0.99).process(0.05, loop_rq=0.11)
    for tid in (101, 102, 103):
        sc.python_thread(tid, f"metrics-{tid - 101}", cpu=0.31)
    a = analyze(sc.tl)
    assert a.profile.samples == 0
    f = next(f for f in a.findings if f.id == "GIL001")
    assert "before its loop" in f.message
    assert a.verdict["finding"] == "GIL001" and a.verdict["sure"]


def _finding(fid: str, impact: float, severity: str = "warning") -> Finding:
    return Finding(
        id=fid,
        title=fid,
        severity=severity,
        confidence=0.99,
        impact=impact,
        message="",
        evidence=(),
        recommendation=Recommendation("", ()),
        expected_speedup=1.0,
    )


def test_the_box_ranks_by_its_impact_like_any_cause():
    """Beside a burner the job's planted fix moved it x0.92 and a pool sized to the free core
    x1.75: the larger cause leads, in the box or not."""
    data, host, note = (
        _finding("DATA001", 0.4),
        _finding("HOST002", 0.6),
        _finding("START001", 0.0, "note"),
    )
    assert [f.id for f in ranked([data, note, host])] == ["HOST002", "DATA001", "START001"]
    assert [f["id"] for f in ranked([{"id": "A", "impact": 0.1}, {"id": "B", "impact": 0.2}])] == [
        "B",
        "A",
    ]
