"""Exact throughput metrics and SYNC001 from scripted hook samples."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import Sample, Target
from gpudiag.probes.gpu.nvml import Nvml
from gpudiag.probes.gpu.probe import GpuProbe
from gpudiag.probes.inprocess.channel import parse_message
from tests.analyzers.scenario import Scenario
from tests.analyzers.test_gpu_findings import ME
from tests.probes.fake_nvml import FakeGpu, FakeNvml, const
from tests.probes.test_gpu_probe import Clock

HOST_WORK = {"forward": 0.35, "backward": 0.45, "optimizer": 0.15, "other": 0.05}


def hook_timeline(
    n: int = 200, dt: float = 0.1, dw: float = 0.02, syncs: int = 0, sync_t: float = 0.0
) -> Timeline:
    tl = Timeline()
    rows = [[1000.0, None, 0, 0, 0, 0, 0, 0, 0]]
    for i in range(1, n):
        step = dt * (2.0 if i % 10 == 0 else 1.0)  # one slow step in 10
        rows.append([1000.0 + i * dt, step, dw, 32, 0.0, 0, 0, syncs, sync_t])
    sites = {"/work/train.py:88:train:item": 40} if syncs else {}
    tl.extend(parse_message({"steps": rows, "sites": sites}))
    return tl


def test_throughput_metrics_from_hooks():
    m = analyze(hook_timeline()).metrics
    assert m["steps"] == 200
    total = 0.1 * (199 + 19)  # 19 steps of 0.2 s among 199
    assert m["steps_per_second"] == pytest.approx(199 / total)
    assert m["samples_per_second"] == pytest.approx(199 * 32 / total)
    assert m["step_time_p50_s"] == pytest.approx(0.1, rel=0.02)
    assert m["step_time_p95_s"] == pytest.approx(0.2, rel=0.02)
    assert m["step_time_max_s"] == pytest.approx(0.2)
    assert m["data_wait_ratio"] == pytest.approx(199 * 0.02 / total)


def gpu_hook_timeline(util: int, shares: dict, syncs: int) -> Timeline:
    """Hooks (10 steps/s, `syncs` syncs each), stack windows and a GPU at `util`% busy."""
    sc = Scenario(cpu_count=16)
    for _ in range(7):
        sc.window(shares)
    clock = Clock()
    probe = GpuProbe(
        Nvml(FakeNvml([FakeGpu(job_pids=[ME], util=const(util))], clock=clock)), clock_ns=clock.ns
    )
    assert probe.open(Target(ME)).available
    for _ in range(21):
        clock.t += 1.0
        sc.tl.extend(probe.sample())
    rows = [[1000.0 + 1.0, None, 0, 0, 0, 0, 0, 0, 0]]
    rows += [[1001.0 + i * 0.1, 0.1, 0.0, 32, 0.0, 0, 0, syncs, 0.03] for i in range(1, 190)]
    sites = {"/work/train.py:88:train:item": 40} if syncs else {}
    sc.tl.extend(parse_message({"steps": rows, "sites": sites}))
    return sc.tl


def test_sync001_counts_the_gpu_idle_after_syncs_and_names_the_call_site():
    a = analyze(gpu_hook_timeline(50, HOST_WORK, syncs=3))
    f = next(f for f in a.findings if f.id == "SYNC001")
    assert str(f.location) == "/work/train.py:88:train"
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["syncs_per_step"] == 3
    # host work and GPU work serialised at 50% each: overlapping them halves the step
    assert f.impact == pytest.approx(0.5, abs=0.05)
    assert f.expected_speedup == pytest.approx(2.0, rel=0.1)


def test_syncs_in_a_gpu_bound_job_are_not_a_finding():
    """Blocked in .item() while the GPU computes is GPU-bound time, not a stall."""
    a = analyze(gpu_hook_timeline(97, {"sync": 0.7, "forward": 0.1, "backward": 0.2}, syncs=1))
    assert "SYNC001" not in [f.id for f in a.findings]


def test_syncs_without_a_gpu_signal_are_not_guessed():
    a = analyze(hook_timeline(syncs=3, sync_t=0.03))
    assert "SYNC001" not in [f.id for f in a.findings]


def test_few_syncs_are_not_a_finding():
    a = analyze(hook_timeline(syncs=1, sync_t=0.001))
    assert "SYNC001" not in [f.id for f in a.findings]


def test_no_hooks_no_throughput_metrics():
    tl = Timeline()
    tl.add(Sample("host", 1, {}, {"cpu_util": 0.5}))
    assert "steps" not in analyze(tl).metrics
