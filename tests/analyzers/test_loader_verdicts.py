"""One cause, one id: the loader-bound finding does not flip on the idle-cores reading, and a
loader that waits (off-CPU) is told to add workers, one that computes to get cheaper."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.context.context import Context, build_context
from gpudiag.analyzers.findings import data
from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.analyzers.measures.window import find_loop_window
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Timeline
from tests.analyzers.scenario import Scenario

SHARES = {"data_wait": 0.4, "forward": 0.25, "backward": 0.3, "optimizer": 0.05}


def run(host: float, loop_cpu: float, cpu_count: int = 2, **kw) -> list:
    sc = Scenario(cpu_count=cpu_count)
    for _ in range(5):
        sc.window(SHARES, **{k: v for k, v in kw.items() if k in ("workers", "worker_busy")})
    sc.host(host)
    sc.process(loop_cpu, **{k: v for k, v in kw.items() if k in ("workers", "worker_cpu")})
    return list(analyze(sc.tl).findings)


@pytest.mark.parametrize("host", [0.35, 0.6, 0.8, 0.95, 0.99])
def test_inline_loader_keeps_data001_whatever_the_idle_cores(host):
    """The same job read on a box idling 1.3 or 0.02 cores: DATA001 every time."""
    fs = run(host, loop_cpu=0.97)
    assert [f.id for f in fs] == ["DATA001"]


def loop_context(tl: Timeline, th: Thresholds) -> Context:
    """The analysis context of the loop window, as `analyze` builds it (no user rules)."""
    clf = Classifier(())
    win = find_loop_window(tl, clf)
    view = tl.window(win.start_ns, win.end_ns) if win.found else tl.whole()
    return build_context(tl, view, win, th, clf)


INLINE = {"forward": 0.25, "backward": 0.3, "optimizer": 0.05}


def run_inline(host: float, loop_cpu: float, how: str) -> list:
    sc = Scenario(cpu_count=2)
    for _ in range(5):
        sc.window({**INLINE, how: 0.4})
    sc.host(host).process(loop_cpu)
    return list(analyze(sc.tl).findings)


def test_waiting_inline_loader_gets_workers_on_a_saturated_box():
    """__getitem__ sleeps (a network read): the loop thread is off-CPU while it loads."""
    fs = run_inline(0.98, loop_cpu=0.55, how="data_sleep")
    assert [f.id for f in fs] == ["DATA001"]
    f = fs[0]
    assert "num_workers=2" in f.recommendation.summary
    assert "cannot help" not in f.recommendation.summary
    ev = {e.metric: e for e in f.evidence}
    assert ev["loader_off_cpu_share"].value >= 0.5
    assert ev["loader_off_cpu_share"].setting == "loader_wait_min"
    assert f.expected_speedup > 1.3


def test_workers_that_wait_are_not_data002_even_past_the_cores():
    """8 workers on 2 cores that mostly sleep: more workers still overlap their waits."""
    fs = run(0.97, loop_cpu=0.5, workers=8, worker_busy=0.9, worker_cpu=0.8)
    assert [f.id for f in fs] == ["DATA001"]
    # 8 loaders pace a step whose rest is 60%: 8 / 0.6 -> 14 hide the wait
    assert "num_workers=14" in fs[0].recommendation.summary


def test_workers_that_compute_and_fill_the_cores_are_data002():
    """The job's own workers fill the physical cores with CPU work: DATA002, a fact of the job."""
    fs = run(0.97, loop_cpu=0.5, cpu_count=4, workers=6, worker_busy=0.95, worker_cpu=3.4)
    assert [f.id for f in fs] == ["DATA002"]
    assert fs[0].fix is None  # more workers cannot help: nothing to try


def test_inline_loader_off_cpu_waiting_on_native_threads_computes():
    """A fast tokenizer's thread pool does the work while the loop thread waits for it: off-CPU
    as much as a sleeping loader by schedstat, but no sampled line waits (the Trainer script:
    2 workers gave x0.98). Not told to add workers on a saturated box."""
    fs = run_inline(0.98, loop_cpu=0.55, how="data_compute")
    assert [f.id for f in fs] == ["DATA001"]
    ev = {e.metric: e for e in fs[0].evidence}
    assert ev["loader_off_cpu_share"].value >= 0.5
    assert ev["loader_blocking_call_share"].value == 0.0
    assert "helps once cores are free" in fs[0].recommendation.summary


def test_hook_timed_steps_make_a_modest_data_wait_sure():
    """The Trainer script (tokenising in its collator): 14.6% of the step waiting for batches,
    timed exactly over 200 steps, pre-tokenising measured x1.28. Each timed step is an exact
    measurement, not a correlated stack sample: the verdict is sure, as it is not from 448
    stack samples alone."""
    sc = Scenario(cpu_count=2)
    for _ in range(2):
        sc.window({**INLINE, "data_compute": 0.11}, ticks=224)  # 15% of the samples
    sc.host(0.93).process(0.9)
    a = analyze(sc.tl)
    th = Thresholds()
    c = loop_context(sc.tl, th)
    timed = data.find(replace(c, metrics={**c.metrics, "data_wait_ratio": 0.146, "steps": 200.0}))
    assert [f.id for f in timed] == ["DATA001"]
    assert timed[0].confidence >= th.sure_confidence
    sampled = [f for f in a.findings if f.id == "DATA001"]
    assert not sampled or sampled[0].confidence < th.sure_confidence
