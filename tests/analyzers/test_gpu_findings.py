"""GPU findings from fake-NVML timelines: the scenarios a GPU job shows."""

from __future__ import annotations

import os

import pytest

from gpudiag.analyzers import analyze
from gpudiag.probes.base import Target
from gpudiag.probes.gpu.nvml import Nvml
from gpudiag.probes.gpu.probe import GpuProbe
from tests.analyzers.scenario import Scenario
from tests.probes.fake_nvml import FakeGpu, FakeNvml, const
from tests.probes.test_gpu_probe import Clock

ME = os.getpid()
HEALTHY = {"forward": 0.35, "backward": 0.45, "optimizer": 0.15, "other": 0.05}
STARVED = {"data_wait": 0.7, "forward": 0.1, "backward": 0.15, "optimizer": 0.05}


def timeline(*gpus: FakeGpu, shares: dict | None = None, seconds: int = 20) -> Scenario:
    """Host-side windows for `shares` plus `seconds` of GPU samples from fake NVML."""
    sc = Scenario(cpu_count=16)
    for _ in range(5):
        sc.window(shares or HEALTHY)
    sc.host(0.2).process(0.9)
    clock = Clock()
    probe = GpuProbe(Nvml(FakeNvml(list(gpus), clock=clock)), clock_ns=clock.ns)
    assert probe.open(Target(ME)).available
    for _ in range(seconds):
        clock.t += 1.0
        sc.tl.extend(probe.sample())
    return sc


def ids(a) -> list[str]:
    return [f.id for f in a.findings]


def test_healthy_busy_gpu_has_no_findings():
    a = analyze(timeline(FakeGpu(job_pids=[ME])).tl)
    assert ids(a) == []
    assert a.metrics["gpu0_busy"] == pytest.approx(0.95)


def test_starved_gpu_under_a_data_starved_job_is_data001_with_gpu_idle_share():
    a = analyze(timeline(FakeGpu(job_pids=[ME], util=const(25)), shares=STARVED).tl)
    assert ids(a)[0] == "DATA001"
    f = a.findings[0]
    assert "GPU sat idle 75%" in f.message
    assert {e.metric for e in f.evidence} >= {"gpu_idle_share", "gpu_idle_caused"}
    assert "GPU001" not in ids(a)  # the host side explains the idle GPU


def test_idle_gpu_while_the_loop_works_on_the_cpu_is_host001():
    """GPU idle while the loop thread is in forward/backward/optimizer: the host is the
    critical path (not 'a cause the host side does not show')."""
    a = analyze(timeline(FakeGpu(job_pids=[ME], util=const(30))).tl)
    assert ids(a) == ["HOST001", "COST001"]  # idle GPU time on a priced H100 costs money
    f = a.findings[0]
    assert f.impact == pytest.approx(0.7, abs=0.02)
    assert "x" in f.speedup_basis and f.expected_speedup <= 1 / 0.3 + 1e-6


def test_idle_gpu_with_no_stacks_is_gpu001():
    """Without stack samples neither side explains the idle: GPU001, on NVML alone."""
    sc = Scenario(cpu_count=16)
    clock = Clock()
    probe = GpuProbe(
        Nvml(FakeNvml([FakeGpu(job_pids=[ME], util=const(30))], clock=clock)), clock_ns=clock.ns
    )
    assert probe.open(Target(ME)).available
    for _ in range(20):
        clock.t += 1.0
        sc.tl.extend(probe.sample())
    a = analyze(sc.tl)
    assert ids(a) == ["GPU001", "COST001"]
    assert a.findings[0].confidence < 0.7  # rests on NVML utilisation alone


def test_thermal_throttling_names_the_reason():
    gpu = FakeGpu(job_pids=[ME], throttle={"hw_thermal": const(0.4)}, sm_clock=const(1400))
    a = analyze(timeline(gpu).tl)
    assert ids(a) == ["THROT001"]
    f = a.findings[0]
    assert "hardware thermal slowdown" in f.title
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["throttle_hw_thermal[gpu0]"] == pytest.approx(0.4, abs=0.04)
    assert "29% below its maximum" in f.message


def test_pcie_bound_transfers_on_a_gen4_card():
    gpu = FakeGpu(job_pids=[ME], util=const(40), pcie_gen=4, pcie_gen_max=4, pcie_rx=const(25e9))
    a = analyze(timeline(gpu).tl)
    assert ids(a)[0] == "XFER001"
    ev = {e.metric: e for e in a.findings[0].evidence}
    assert ev["pcie_rx_share_of_link[gpu0]"].value == pytest.approx(25 / 31.5, abs=0.01)
    assert "pin_memory=True" in " ".join(a.findings[0].recommendation.actions)


def test_vram_headroom_9_of_80_gib_gives_a_batch_multiplier():
    gpu = FakeGpu(job_pids=[ME], job_mem=const(9 * 2**30), mem_used=const(10 * 2**30))
    a = analyze(timeline(gpu).tl)
    assert ids(a) == ["MEM001"]
    f = a.findings[0]
    assert f.severity == "note"
    assert "7x" in f.recommendation.summary
    # no GPM counters in the fake: no right-size projection, so no GPU model is named
    assert len(f.recommendation.actions) == 1 and "GPU" not in f.recommendation.summary


def test_vram_near_the_limit_is_mem002():
    gpu = FakeGpu(job_pids=[ME], job_mem=const(78 * 2**30))
    assert ids(analyze(timeline(gpu).tl)) == ["MEM002"]


def test_two_uneven_gpus_are_flagged():
    a = analyze(
        timeline(
            FakeGpu(job_pids=[ME], util=const(95)),
            FakeGpu(uuid="GPU-1", job_pids=[ME], util=const(45)),
        ).tl
    )
    assert "GPU004" in ids(a)
    f = next(f for f in a.findings if f.id == "GPU004")
    assert {e.metric for e in f.evidence} >= {"gpu_busy[gpu0]", "gpu_busy[gpu1]"}
    assert "spread" in f.speedup_basis  # every prediction says how it was made


def test_launch_bound_and_fp32_need_gpm():
    launch = FakeGpu(job_pids=[ME], util=const(98), gpm={2: const(15), 5: const(1)})
    a = analyze(timeline(launch).tl)
    assert ids(a) == ["GPU002"]
    assert "SMs" in a.findings[0].speedup_basis  # every prediction says how it was made
    fp32 = FakeGpu(job_pids=[ME], util=const(98), gpm={2: const(85), 5: const(0.5)})
    a = analyze(timeline(fp32).tl)
    assert ids(a) == ["GPU003"]
    assert "allow_tf32" in " ".join(a.findings[0].recommendation.actions)


def test_no_gpu_means_no_gpu_findings():
    sc = Scenario(cpu_count=16)
    for _ in range(5):
        sc.window(STARVED)
    sc.host(0.2).process(0.9)
    a = analyze(sc.tl)
    assert ids(a) == ["DATA001"] and "GPU" not in a.findings[0].message


def test_cpu_only_job_on_a_gpu_box_gets_no_idle_gpu_finding(monkeypatch):
    monkeypatch.setattr("gpudiag.probes.gpu.probe.has_nvidia_device_open", lambda pids: False)
    a = analyze(timeline(FakeGpu(job_pids=[], util=const(0), mem_used=const(0))).tl)
    assert ids(a) == []
