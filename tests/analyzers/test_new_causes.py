"""EVAL001 (evaluation inside the training loop), HOST003 (the job's own threads oversubscribe
its cores) and DATA003 (workers re-created every epoch) over scripted timelines, each with a
healthy case that must not raise it."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.findings.evaluation import nice_ceil, share_after
from gpudiag.analyzers.measures.loop import thread_series_samples
from gpudiag.probes.base import Sample
from gpudiag.probes.stacks.pyspy_output import episode_anchor, is_eval_frame
from tests.analyzers.scenario import LOOP, SITE, STACKS, Scenario
from tests.analyzers.test_findings import HEALTHY, ids, windows

EVAL = (
    f"{LOOP};evaluate (/work/train.py:90);Module._wrapped_call_impl "
    f"({SITE}/torch/nn/modules/module.py:1511);Net.forward (/work/model.py:20)"
)
STACKS["eval"] = EVAL  # an evaluation pass's forward: a "forward" sample under evaluate()
TRAIN = {"forward": 0.12, "backward": 0.18, "optimizer": 0.05, "data_wait": 0.02}


def steps(sc: Scenario, times: list[float], waits: list[float] | None = None) -> Scenario:
    """Hooks step rows with these wall times (and DataLoader waits), spread over the windows
    written."""
    waits = waits or [0.0] * len(times)
    for t, v, w in zip(sc._times(len(times), 10_000_000), times, waits, strict=True):
        sc.tl.add(Sample("hooks", t, {"kind": "step"}, {"step_time_s": v, "data_wait_s": w}))
    return sc


def evaluating(eval_share: float, hooks: bool = True) -> Scenario:
    shares = {k: v * (1 - eval_share) / sum(TRAIN.values()) for k, v in TRAIN.items()}
    sc = windows(Scenario(), shares=shares | {"eval": eval_share}).host(0.3).process(0.95)
    if hooks:  # every 10th step carries a pass: 9 steps of 0.1 s, then one of 0.1 + E
        per_pass = eval_share / (1 - eval_share) * 1.0
        steps(sc, ([0.1] * 9 + [0.1 + per_pass]) * 15)
    return sc


def test_evaluation_every_10_steps_is_eval001_with_its_interval():
    a = analyze(evaluating(0.64).tl)
    f = a.findings[0]
    assert f.id == "EVAL001"
    assert f.impact == pytest.approx(0.64, abs=0.02)
    ev = {e.metric: e for e in f.evidence}
    assert ev["eval_share"].setting == "eval_share_warn"
    assert ev["steps_between_evaluations"].value == pytest.approx(10, abs=0.5)
    assert ev["seconds_per_evaluation"].value == pytest.approx(1.78, rel=0.1)
    # 10 steps of training between passes -> 0.64 * 0.9 / (0.36 * 0.1) = 16x: every 160 -> 200
    assert "every 200 steps instead of every 10" in f.recommendation.actions[0]
    assert ev["eval_share_after_fix"].value <= 0.10
    assert str(f.location) == "/work/train.py:40:train"
    assert f.expected_speedup == pytest.approx((1 - 0.082) / 0.36, rel=0.05)


def test_evaluation_without_hooks_takes_its_interval_from_the_episodes():
    sc = evaluating(0.5, hooks=False)
    anchor = f"{LOOP};evaluate (/work/train.py)"
    for _ in range(5):
        sc.tl.add(
            Sample(
                "stacks",
                sc.t,
                {
                    "mode": "all",
                    "kind": "episode",
                    "pid": "100",
                    "tid": "100",
                    "anchor": anchor,
                    "thread": "MainThread",
                },
                {"episodes": 1, "count": 150},
            )
        )
    f = next(f for f in analyze(sc.tl).findings if f.id == "EVAL001")
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["evaluations_seen"] == 5 and ev["seconds_between_evaluations"] == 3.0
    assert "s of training instead of every 3 s" in f.recommendation.actions[0]


def test_a_little_evaluation_or_an_evaluation_job_is_not_eval001():
    assert "EVAL001" not in ids(analyze(evaluating(0.08).tl))
    only_eval = windows(Scenario(), shares={"eval": 0.9, "data_wait": 0.1}).host(0.3).process(0.9)
    assert "EVAL001" not in ids(analyze(only_eval.tl))  # nothing trains: evaluating is the job
    assert "EVAL001" not in ids(analyze(windows(Scenario(), shares=HEALTHY).host(0.3).tl))


def test_eval_frames_name_evaluation_not_training():
    assert is_eval_frame("evaluate (/w/t.py:3)") and is_eval_frame("run_validation (/w/t.py:3)")
    assert is_eval_frame("val_epoch (/w/t.py:3)")
    assert not is_eval_frame("train_and_evaluate (/w/t.py:3)")
    assert not is_eval_frame("_validate_args (/v/site-packages/torch/distributions/d.py:3)")
    assert not is_eval_frame("get_val (/w/t.py:3)")
    # one pass is one episode, whatever it calls inside
    frames = tuple(EVAL.split(";"))
    assert episode_anchor(frames) == f"{LOOP};evaluate (/work/train.py)"


def test_interval_arithmetic():
    assert nice_ceil(101) == 150 and nice_ceil(160) == 200 and nice_ceil(0.5) == 1
    assert share_after(0.64, 10) == pytest.approx(0.64 / (0.64 + 3.6))


def own_threads(
    loop_rq: float,
    want: tuple[float, float],
    allowed: float | None = 2.0,
    others: float = 0.0,
    threads: float = 18.0,
) -> Scenario:
    """A 2-core job whose threads ran want[0] cores and queued want[1] more."""
    sc = windows(Scenario(cpu_count=2), shares=HEALTHY).host(0.99).process(0.3, loop_rq=loop_rq)
    for t in sc._times(10, 200_000_000):
        vals = {
            "cpu_cores": want[0],
            "runqueue_cores": want[1],
            "threads": threads,
            "running_share": 0.4,
        }
        if allowed is not None:
            vals["cpus_allowed"] = allowed
        sc.tl.add(Sample("process", t, {"scope": "target"}, vals))
    if others:
        sc.others({("4242", "burner"): others})
    return sc


def test_a_pool_wider_than_the_cores_is_host003_not_host002():
    a = analyze(own_threads(0.6, (1.9, 9.0), others=0.9).tl)
    assert a.findings[0].id == "HOST003"
    assert "HOST002" not in ids(a)  # the box's other process is not what the loop waits for
    f = a.findings[0]
    ev = {e.metric: e for e in f.evidence}
    assert ev["loop_runqueue_wait_for_own_threads"].setting == "job_runqueue_warn"
    # the target's readings: 1.9 cores ran and 9 queued, beside the loop-only ones (0.3 ran)
    assert ev["job_cores_wanted_beyond_available"].value == pytest.approx(1.1 + 9.0 - 2.0)
    assert ev["job_cores_available"].value == 2.0
    assert "torch.set_num_threads(2)" in f.recommendation.summary


def test_the_cores_available_to_the_job_are_its_affinity_not_the_hosts():
    """A job pinned to 1 of the box's 8 cores, 4 threads wanting 3.5 of them."""
    sc = own_threads(0.5, (1.0, 2.5), allowed=1.0)
    sc.cpu_count = 8
    assert "HOST003" in ids(analyze(sc.tl))


def test_a_job_whose_threads_fit_or_whose_loop_gets_a_core_is_not_host003():
    assert "HOST003" not in ids(analyze(own_threads(0.05, (1.9, 0.3)).tl))  # fits
    assert "HOST003" not in ids(analyze(own_threads(0.05, (1.9, 6.0)).tl))  # loop runs
    # most of the wait is another process's: HOST002's, not HOST003's
    a = analyze(own_threads(0.5, (1.9, 0.2), others=1.0).tl)
    assert "HOST003" not in ids(a) and "HOST002" in ids(a)


def crowded_loaders(own_pools: bool) -> Scenario:
    """2 workers filling a 2-core box's loading core, the loop waiting 30% for batches; with
    `own_pools` the job's threads also want 9 cores more than the 2 (HOST003)."""
    shares = {"data_wait": 0.3, "forward": 0.3, "backward": 0.4}
    sc = windows(Scenario(cpu_count=2), shares=shares, workers=2, worker_busy=0.95, worker_io=0.0)
    sc = sc.host(0.99).process(0.3, workers=2, worker_cpu=1.9, loop_rq=0.45 if own_pools else 0.0)
    if own_pools:
        for t in sc._times(10, 200_000_000):
            vals = {"cpu_cores": 1.9, "runqueue_cores": 9.0, "threads": 18.0, "cpus_allowed": 2.0}
            sc.tl.add(Sample("process", t, {"scope": "target"}, vals))
    return sc


def test_batches_late_behind_the_jobs_own_threads_are_host003_with_the_wait_a_note():
    """torch.set_num_threads(16) and 4 threads a worker on 2 cores: the loaders are slow
    because the job crowds its cores, and HOST003's thread counts moved the job x1.76-1.99."""
    alone = analyze(crowded_loaders(own_pools=False).tl)
    assert alone.findings[0].id == "DATA002" and "HOST003" not in ids(alone)
    a = analyze(crowded_loaders(own_pools=True).tl)
    assert a.findings[0].id == "HOST003" and a.verdict["finding"] == "HOST003"
    data = next(f for f in a.findings if f.id == "DATA002")
    assert data.severity == "note" and "(HOST003)" in data.message


def churning(starts: float, exits: float, wait: float = 0.7) -> Scenario:
    shares = {"data_wait": wait, "forward": (1 - wait) * 0.4, "backward": (1 - wait) * 0.6}
    sc = windows(Scenario(), shares=shares).host(0.5).process(0.4, workers=2, worker_cpu=0.8)
    for i, t in enumerate(sc._times(15, 1_000_000_000)):
        sc.tl.add(
            Sample(
                "process",
                t,
                {"scope": "workers"},
                {
                    "procs": 2.0,
                    "worker_starts": starts if i % 3 == 0 else 0.0,
                    "worker_exits": exits if i % 3 == 0 else 0.0,
                },
            )
        )
    return sc


def test_workers_recreated_every_epoch_is_data003_not_data001():
    a = analyze(churning(2, 2).tl)
    assert ids(a)[0] == "DATA003" and "DATA001" not in ids(a)
    f = a.findings[0]
    ev = {e.metric: e for e in f.evidence}
    # 10 started and ended, 2 at a time: 5 generations (4 inside the loop's window)
    assert 4.0 <= ev["worker_generations_recreated"].value <= 5.0
    assert ev["worker_generations_recreated"].setting == "worker_respawn_min"
    assert ev["data_wait_at_epoch_start_share"].setting == "data_wait_warn"
    assert f.fix == {"kind": "dataloader", "values": {"persistent_workers": True}}
    assert "persistent_workers=True" in f.recommendation.summary


def test_the_wait_at_epoch_starts_comes_from_the_long_steps():
    """Hooks: 5 epochs of 30 steps, each first step 1.5 s longer: the start's wait is that."""
    sc = churning(2, 2)
    steps(sc, ([1.6] + [0.1] * 29) * 5, ([1.55] + [0.02] * 29) * 5)
    f = next(f for f in analyze(sc.tl).findings if f.id == "DATA003")
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["seconds_lost_per_epoch_start"] == pytest.approx(1.5, rel=0.05)
    assert f.impact == pytest.approx(7.5 / 22.5, rel=0.05)  # not the whole wait (47%)


def test_persistent_workers_or_no_wait_is_not_data003():
    a = analyze(churning(0, 0).tl)
    assert "DATA003" not in ids(a) and "DATA001" in ids(a)  # no churn: the loaders' DATA001
    assert "DATA003" not in ids(analyze(churning(2, 2, wait=0.03).tl))  # churn, no wait


def test_a_function_decorated_with_no_grad_is_an_evaluation_pass_whatever_its_name():
    """nanoGPT's estimate_loss (@torch.no_grad()): torch's decorator frame marks it."""
    from gpudiag.probes.stacks.pyspy_output import eval_frame_index

    site = "/v/lib/python3.11/site-packages/torch"
    frames = (
        "<module> (/w/train.py:181)",
        f"context_decorator.<locals>.decorate_context ({site}/utils/_contextlib.py:124)",
        "estimate_loss (/w/train.py:158)",
        f"Module._wrapped_call_impl ({site}/nn/modules/module.py:1778)",
    )
    assert eval_frame_index(frames) == 2
    assert eval_frame_index((frames[0], "estimate_loss (/w/train.py:158)")) is None


def test_one_stray_backward_sample_under_evaluate_does_not_hide_evaluation():
    """py-spy reads stacks without pausing the job: one torn sample that shows evaluate()
    above a backward frame must not make evaluate() a training function."""
    from gpudiag.analyzers.findings.evaluation import eval_time
    from gpudiag.analyzers.measures.loop import profile_loop
    from gpudiag.analyzers.measures.rules import Classifier
    from gpudiag.analyzers.timeline.timeline import Timeline
    from gpudiag.probes.base import Sample

    site = "/v/lib/python3.11/site-packages/torch"
    ev = "<module> (/w/t.py:40);evaluate (/w/t.py:10)"
    stacks = {
        f"{ev};Module._call_impl ({site}/nn/modules/module.py:1789)": 60,
        f"{ev};backward ({site}/autograd/__init__.py:266)": 1,
        f"<module> (/w/t.py:41);backward ({site}/autograd/__init__.py:266)": 30,
    }
    tl = Timeline()
    for stack, n in stacks.items():
        labels = {"mode": "all", "kind": "stack", "pid": "1", "tid": "1", "thread": "MainThread",
                  "role": "target", "stack": stack, "code": ""}  # fmt: skip
        tl.add(Sample("stacks", 10**12, labels, {"count": n}))
    clf = Classifier()
    view = tl.whole()
    got = eval_time(view, profile_loop(view, clf), clf)
    assert got is not None and got.function == "evaluate" and got.samples == 61


def test_an_oversubscribed_pool_beside_a_saturated_gpu_is_a_note():
    """HOST003 graded like HOST002: a fake H100 98% busy does not wait for the loop thread,
    whatever its run-queue wait, so the pool costs nothing measurable (a note saying why)."""
    from tests.analyzers.test_host_contention import on_fake_gpu

    a = analyze(on_fake_gpu(own_threads(0.6, (1.9, 9.0)), 98, 85).tl)
    f = next(f for f in a.findings if f.id == "HOST003")
    assert f.severity == "note" and f.impact < 0.05
    assert {e.metric for e in f.evidence} >= {"gpu_idle_share"}
    assert "does not wait for the host" in f.message


def test_schedstat_readings_count_as_the_time_they_cover():
    """A run-queue share's confidence rests on the time its readings integrate (as stack
    samples at py-spy's 100 Hz over it), whatever the interval the budget set: ten readings
    0.2 s apart cover 2 s, five 1 s apart 5 s."""
    sc = Scenario(cpu_count=2)
    for tid, n, gap_ns in (("7", 10, 200_000_000), ("8", 5, 1_000_000_000)):
        for i in range(n):
            labels = {"scope": "thread", "tid": tid}
            sc.tl.add(Sample("process", (i + 1) * gap_ns, labels, {"runqueue_wait": 0.4}))
    assert thread_series_samples(sc.tl, "runqueue_wait", 7) == pytest.approx(200.0)
    assert thread_series_samples(sc.tl, "runqueue_wait", 8) == pytest.approx(500.0)
    assert thread_series_samples(sc.tl, "runqueue_wait", 9) == 0.0
