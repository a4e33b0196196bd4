"""HOST002: other processes take the CPU the job's loop thread needs (direct signals only)."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.catalogue import spec
from gpudiag.probes.base import Target
from gpudiag.probes.gpu.nvml import Nvml
from gpudiag.probes.gpu.probe import GpuProbe
from tests.analyzers.scenario import Scenario
from tests.analyzers.test_gpu_findings import ME
from tests.probes.fake_nvml import FakeGpu, FakeNvml, const
from tests.probes.test_gpu_probe import Clock

HEALTHY = {"forward": 0.35, "backward": 0.45, "optimizer": 0.15, "data_wait": 0.03, "other": 0.02}


def scenario(
    runqueue: float, others: float, loop_cpu: float = 0.6, shares: dict | None = None
) -> Scenario:
    sc = Scenario(cpu_count=2)
    for _ in range(5):
        sc.window(shares or HEALTHY)
    sc.host(0.99)
    for i, t in enumerate(sc._times(10, 200_000_000)):
        sc._add_at(
            t,
            "process",
            {"scope": "thread", "tid": "100", "comm": "python"},
            {"cpu": loop_cpu, "runqueue_wait": runqueue, "running": 1.0, "d_state": 0.0},
        )
        if i % 2 == 0:
            sc._add_at(t, "host", {"scope": "others"}, {"other_cpu_cores": others})
            sc._add_at(
                t,
                "host",
                {"scope": "other", "pid": "4242", "comm": "burner"},
                {"other_cpu_cores": others * 0.9},
            )
    return sc


def test_other_processes_taking_the_cpu_is_host002_naming_them():
    a = analyze(scenario(runqueue=0.4, others=1.0).tl)
    f = next(f for f in a.findings if f.id == "HOST002")
    assert f.severity in ("warning", "error")
    assert "pid 4242 'burner' 0.9 cores" in f.message
    ev = {e.metric: e for e in f.evidence}
    assert ev["loop_runqueue_wait_for_other_processes"].setting == "host_runqueue_warn"
    assert ev["other_processes_cpu_cores"].setting == "host_other_cores_min"
    assert spec("HOST002").category == "host"


def test_a_busy_box_without_the_loop_waiting_for_a_cpu_is_not_host002():
    """Others use the CPU but the loop thread gets a core when it needs one."""
    a = analyze(scenario(runqueue=0.05, others=1.5).tl)
    assert "HOST002" not in [f.id for f in a.findings]


def test_the_loop_waiting_on_its_own_threads_is_not_host002():
    """Run-queue wait with nothing else on the box: the job competes with itself."""
    a = analyze(scenario(runqueue=0.4, others=0.1).tl)
    assert "HOST002" not in [f.id for f in a.findings]


def test_run_queue_wait_the_jobs_own_threads_cause_is_not_blamed_on_the_box():
    """The job alone wants 3 cores of the 2 (its threads ran 2.0 cores and waited 1.0 more in
    the run queue); others use 0.6: most of the loop's wait is the job's own, and removing
    the others would not remove it."""
    sc = scenario(runqueue=0.4, others=0.6)
    for t in sc._times(10, 200_000_000):
        sc._add_at(t, "process", {"scope": "target"}, {"cpu_cores": 2.0, "runqueue_cores": 1.0})
    a = analyze(sc.tl)
    assert "HOST002" not in [f.id for f in a.findings]


def test_a_job_that_fits_the_box_waits_only_for_the_others():
    """The job wants 1.9 of the 2 cores (loop + intra-op pool): every bit of the loop's wait
    for a CPU is the other processes' (measured: a burner slowed such a job's backward 10x)."""
    sc = scenario(runqueue=0.4, others=0.6)
    for t in sc._times(10, 200_000_000):
        sc._add_at(t, "process", {"scope": "target"}, {"cpu_cores": 1.5, "runqueue_cores": 0.4})
    f = next(f for f in analyze(sc.tl).findings if f.id == "HOST002")
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["loop_runqueue_wait_for_other_processes"] == 0.4


def on_fake_gpu(sc: Scenario, util: float, sm_active: float | None = None) -> Scenario:
    """`sc` with 20 s of samples from a fake H100 at `util`% busy (GPM SM activity if given)."""
    gpm = None if sm_active is None else {2: const(sm_active), 5: const(20)}
    clock = Clock()
    gpu = FakeGpu(job_pids=[ME], util=const(util), gpm=gpm)
    probe = GpuProbe(Nvml(FakeNvml([gpu], clock=clock)), clock_ns=clock.ns)
    assert probe.open(Target(ME)).available
    for _ in range(20):
        clock.t += 1.0
        sc.tl.extend(probe.sample())
    return sc


def test_a_saturated_gpu_over_a_loaded_box_gets_no_host_side_warning():
    """Issue 38: a fake H100 at 98% (SM activity 85%) beside a burner: the loop waits for a
    CPU, but the GPU never waits for the loop, so the contention costs nothing measurable."""
    a = analyze(on_fake_gpu(scenario(runqueue=0.4, others=1.0), 98, 85).tl)
    assert not [f.id for f in a.findings if f.severity != "note" and spec(f.id).category == "host"]
    f = next(f for f in a.findings if f.id == "HOST002")
    assert f.severity == "note" and f.impact < 0.05
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["gpu_idle_share"] == pytest.approx(0.02, abs=0.01)
    assert "saturated" in f.message or "busy" in f.message


def test_contention_on_a_half_idle_gpu_costs_the_idle_it_explains():
    """The same contention with the GPU idle 40%: HOST002 warns, its impact the GPU idle the
    run-queue wait explains (at most the wait itself)."""
    f = next(
        f
        for f in analyze(on_fake_gpu(scenario(runqueue=0.4, others=1.0), 60).tl).findings
        if f.id == "HOST002"
    )
    assert f.severity == "warning" and 0.1 <= f.impact <= 0.4


def test_host002_does_not_outrank_data001_on_a_starved_gpu():
    """The fake starved H100 (25% busy) under a data-starved loop on a loaded box: the idle is
    the input pipeline's; HOST002 comes after DATA001."""
    starved = {"data_wait": 0.7, "forward": 0.1, "backward": 0.15, "optimizer": 0.05}
    sc = scenario(runqueue=0.75, others=1.0, loop_cpu=0.25, shares=starved)
    a = analyze(on_fake_gpu(sc, 25).tl)
    order = [f.id for f in a.findings]
    assert order[0] == "DATA001"
    assert "HOST002" not in order or order.index("HOST002") > order.index("DATA001")
