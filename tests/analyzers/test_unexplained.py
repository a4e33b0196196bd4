"""Every second of the loop accounted for (issue 39): time no frame rule places is named by
its call (BLOCK001 for calls the loop waits for, LOOP001 for the rest), never called
healthy; how sure a check is follows from its effect against its threshold."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.measures.summary import share_interval, straddles
from gpudiag.analyzers.model.thresholds import Thresholds
from tests.analyzers.scenario import Scenario
from tests.analyzers.test_findings import ids, windows

TRAIN = {"forward": 0.2, "backward": 0.25, "optimizer": 0.05}


def run(extra: dict[str, float], n: int = 5, ticks: int = 300, **kw):
    sc = windows(Scenario(cpu_count=8), n=n, shares={**TRAIN, **extra}, ticks=ticks, **kw)
    return analyze(sc.host(0.3).process(0.9).tl)


def test_a_metrics_post_every_step_is_block001_named_by_the_call():
    a = run({"post": 0.5})
    assert ids(a)[0] == "BLOCK001"
    f = a.findings[0]
    assert f.impact == pytest.approx(0.5, abs=0.01)
    assert "urllib.request.urlopen" in f.message and "off-CPU" in f.message
    assert str(f.location) == "/work/train.py:70:push_metrics"
    assert any("background thread" in x for x in f.recommendation.actions)
    ev = {e.metric: e for e in f.evidence}
    assert ev["blocking_call_share"].setting == "blocking_call_warn"
    assert a.verdict["sure"] and a.verdict["finding"] == "BLOCK001"


def test_logging_tensors_each_step_is_a_logging_call():
    a = run({"log_tensor": 0.45})
    f = a.findings[0]
    assert f.id == "BLOCK001" and "logging.debug" in f.message
    assert any("not tensors" in x for x in f.recommendation.actions)


def test_gc_collect_every_step_is_named_not_called_host_code():
    a = run({"gc": 0.6})
    assert ids(a) == ["LOOP001"]
    f = a.findings[0]
    assert "gc.collect()" in f.message
    assert f.recommendation.actions[0].startswith("remove the per-step gc.collect()")
    assert f.speedup_kind == "bound"


def test_library_work_no_rule_knows_is_loop001_with_its_call_site():
    a = run({"json": 0.4})
    assert ids(a) == ["LOOP001"]
    f = a.findings[0]
    assert "json.dumps" in f.message and "/work/train.py:75" in f.message
    ev = {e.metric: e for e in f.evidence}
    assert ev["unplaced_loop_share"].threshold == Thresholds().unexplained_warn


def test_samples_with_no_frame_on_a_python_loop_thread_are_no_native_work():
    """At a load of 8 on 2 cores, 23% of a loop thread's samples came back with no frame while
    the thread ran 15% of the time: unreadable samples, never LOOP001's "native code"."""
    a = run({"unreadable": 0.35})
    assert "LOOP001" not in ids(a)
    assert "LOOP001" in ids(run({"json": 0.35}))  # the same share of real work is named


def test_the_jobs_own_python_stays_host001_and_is_not_counted_twice():
    a = run({"other": 0.5})
    assert ids(a) == ["HOST001"]


@pytest.mark.parametrize("family", ["post", "gc", "json", "log_tensor"])
@pytest.mark.parametrize("share", [0.3, 0.5, 0.8])
def test_unplaced_time_over_the_threshold_never_gets_a_sure_no_bottleneck(family, share):
    rest = 1.0 - share
    sc = windows(
        Scenario(cpu_count=8),
        n=5,
        shares={"forward": rest * 0.5, "backward": rest * 0.5, family: share},
    )
    a = analyze(sc.host(0.3).process(0.9).tl)
    assert a.verdict["finding"] in ("BLOCK001", "LOOP001")


def test_a_healthy_loop_gets_no_warning_and_only_its_unread_compute_left():
    """Stacks alone: no warning, and nothing left but the model's compute, which no stack
    reads (a sure "no bottleneck" needs the hooks' compute table: test_compute_verdict)."""
    a = run({"forward": 0.45, "backward": 0.45, "json": 0.05})
    assert [f for f in a.findings if f.severity != "note"] == []
    assert not a.verdict["sure"] and a.verdict["finding"] is None
    assert "not judged: the model's compute" in a.verdict["statement"]
    assert "attach --hooks" in a.verdict["statement"]


def test_a_small_blocking_share_is_not_a_finding():
    a = run({"forward": 0.4, "backward": 0.5, "post": 0.05})
    assert "BLOCK001" not in ids(a) and "LOOP001" not in ids(a)


def test_a_large_effect_is_sure_on_fewer_samples_than_min_loop_samples():
    # 60 loop samples (a short attach), 60% in checkpoint saves: far above its 5% threshold
    a = run({"forward": 0.2, "backward": 0.2, "checkpoint": 0.6}, n=2, ticks=30)
    assert a.profile.samples < Thresholds().min_loop_samples
    assert ids(a)[0] == "CKPT001" and a.verdict["sure"]


def test_a_share_near_its_threshold_on_few_samples_is_named_not_judged():
    a = run({"forward": 0.45, "backward": 0.45, "json": 0.1}, n=2, ticks=30)
    assert not a.verdict["sure"]
    assert "unexplained loop time" in a.verdict["statement"]


def test_the_share_interval_is_sound_at_zero_and_narrows_with_samples():
    low, high = share_interval(0.0, 30)
    assert low == 0.0 and high > 0.25  # 3 independent samples cannot rule out 25%
    assert not straddles(0.0, 0.25, 3000)
    assert straddles(0.24, 0.25, 300) and not straddles(0.9, 0.25, 300)


def test_library_work_under_the_warning_threshold_is_named_in_a_note_and_the_verdict():
    # a whole-model copy.deepcopy each step: 16% of the held-out job's loop, its fix x1.2
    a = run({"forward": 0.35, "backward": 0.45, "json": 0.2})
    assert [f.id for f in a.findings if f.severity in ("error", "warning")] == []
    (f,) = [f for f in a.findings if f.id == "LOOP001"]
    assert f.severity == "note" and "json.dumps" in f.message
    ev = {e.metric: e for e in f.evidence}
    assert ev["unplaced_loop_share"].setting == "unexplained_note"
    # unexplained time is not a healthy loop: no sure "no bottleneck" over it (the held-out
    # EMA job read one at 23% while its fix measured x1.20-1.40)
    assert a.verdict["finding"] is None and not a.verdict["sure"]
    assert "no rule explains (LOOP001)" in a.verdict["statement"]


def test_a_note_ranks_after_every_warning():
    from gpudiag.analyzers.model.catalogue import ranked

    a = run({"forward": 0.3, "backward": 0.35, "json": 0.2, "post": 0.15})
    order = [(f.id, f.severity) for f in ranked(list(a.findings))]
    assert order[0] == ("BLOCK001", "warning") and ("LOOP001", "note") in order


@pytest.mark.parametrize("wait", ["front_wait", "joined"])
def test_a_process_that_only_waits_is_never_the_loop(wait):
    """LitServe's front end attached to (its model in a worker process) read LOOP001, sure,
    impact 99.99%, bound x100: a process waiting on others does no work to speed up."""
    sc = windows(Scenario(cpu_count=8), n=5, shares={wait: 1.0})
    a = analyze(sc.host(0.3).process(0.9).tl)
    assert "LOOP001" not in ids(a)
    assert all(f.expected_speedup < 2 for f in a.findings)
    assert not a.verdict["sure"] and "only waits" in a.verdict["statement"]


def test_a_loop_that_also_waits_keeps_its_loop001():
    a = run({"joined": 0.5})
    assert ids(a)[0] == "LOOP001" and "waiting" in a.findings[0].message
    assert "only waits" not in a.verdict["statement"]


def test_a_bound_is_held_at_bound_max_and_says_so():
    sc = windows(Scenario(cpu_count=8), n=5, shares={"json": 0.995, "forward": 0.005})
    a = analyze(sc.host(0.3).process(0.9).tl)
    f = next(f for f in a.findings if f.id == "LOOP001")
    assert f.speedup_kind == "bound" and f.expected_speedup == Thresholds().bound_max
    assert "held at x20 (bound_max)" in f.speedup_basis
    lower = analyze(sc.tl, Thresholds(bound_max=5.0))
    assert next(f for f in lower.findings if f.id == "LOOP001").expected_speedup == 5.0


def test_a_front_end_polling_its_starting_workers_only_waits():
    """LitServe's front end sleeps between polls while its workers start, then waits on its
    shutdown event: a look over that read BLOCK001 'a sleep in LitServer.run', x2.9."""
    sc = windows(Scenario(cpu_count=8), n=5, shares={"front_poll": 0.65, "front_wait": 0.35})
    a = analyze(sc.host(0.3).process(0.9).tl)
    assert not {"BLOCK001", "LOOP001"} & set(ids(a))
    assert "only waits" in a.verdict["statement"]


def test_a_loop_that_sleeps_each_step_keeps_its_block001():
    a = run({"sleep": 0.5})
    assert ids(a)[0] == "BLOCK001"
