"""HOST003 (the job's own threads oversubscribe its cores) over scripted timelines: its cores
from the job's affinity, not HOST002's other processes, a note beside a saturated GPU."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.measures.loop import thread_series_samples
from gpudiag.probes.base import Sample
from tests.analyzers.scenario import Scenario
from tests.analyzers.test_findings import HEALTHY, ids, windows


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
