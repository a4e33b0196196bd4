"""GPU probe and NVML layer against scripted fake GPUs (no GPU needed)."""

from __future__ import annotations

import os

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.gpu.nvml import Nvml
from gpudiag.probes.gpu.probe import GpuProbe, visible_devices
from tests.probes.fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    FakeGpu,
    FakeNvml,
)

ME = os.getpid()


class Clock:
    """Seconds for the fake NVML, nanoseconds for the probe: one shared fake time."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def ns(self) -> int:
        return 1_000_000_000_000 + int(self.t * 1e9)


def probe_with(*gpus: FakeGpu, **kw) -> tuple[GpuProbe, Clock, FakeNvml]:
    clock = Clock()
    fake = FakeNvml(list(gpus), clock=clock, **kw)
    return GpuProbe(Nvml(fake), clock_ns=clock.ns), clock, fake


def tick(probe: GpuProbe, clock: Clock, seconds: float = 1.0):
    clock.t += seconds
    return probe.sample()


def test_contract_and_values_from_exact_counters():
    probe, clock, _ = probe_with(FakeGpu(job_pids=[ME], pcie_rx=lambda t: 4e9))
    assert probe.open(Target(ME)).available
    for _ in range(3):
        samples = tick(probe, clock)
    declared = {f.name for f in probe.fields}
    (s,) = samples
    assert set(s.values) <= declared
    assert s.labels["gpu"] == "0" and s.labels["uuid"].startswith("GPU-")
    assert s.values["util_gpu"] == pytest.approx(0.95)
    assert s.values["pcie_rx_bytes_per_s"] == pytest.approx(4e9, rel=0.01)
    assert s.values["job_on_device"] == 1.0 and s.values["job_mem_bytes"] == 60 * 2**30
    assert s.values["throttle_power_cap"] == 0.0


def test_not_supported_is_remembered_not_retried():
    probe, clock, fake = probe_with(
        FakeGpu(job_pids=[ME], errors={"nvmlDeviceGetFieldValues": NVML_ERROR_NOT_SUPPORTED})
    )
    probe.open(Target(ME))
    for _ in range(5):
        tick(probe, clock)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1
    status = probe.final_status()
    assert status.available and "nvmlDeviceGetFieldValues" in status.reason
    # the point-sample fallback still gives PCIe throughput
    assert "pcie_rx_bytes_per_s" in tick(probe, clock)[0].values


def test_process_utilisation_not_found_means_zero():
    probe, clock, _ = probe_with(FakeGpu(job_pids=[]))
    probe.open(Target(ME))
    s = tick(probe, clock)[0]
    assert s.values["job_sm_util"] == 0.0
    assert s.values["job_on_device"] == 0.0


def test_gpu_lost_mid_run_keeps_the_others():
    probe, clock, _ = probe_with(
        FakeGpu(job_pids=[ME], lost_after_s=2.5), FakeGpu(uuid="GPU-1", job_pids=[ME])
    )
    probe.open(Target(ME))
    tick(probe, clock)
    tick(probe, clock)
    after = tick(probe, clock)
    assert [s.labels["gpu"] for s in after] == ["1"]
    assert any("GPU 0" in e and "lost" in e for e in probe.errors)
    assert tick(probe, clock)[0].labels["gpu"] == "1"


@pytest.mark.parametrize(
    "err,words",
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver"),
        (NVML_ERROR_DRIVER_NOT_LOADED, "not loaded"),
    ],
)
def test_no_driver_is_unavailable_with_a_hint(err, words):
    probe, _, _ = probe_with(FakeGpu(), init_error=err)
    status = probe.open(Target(ME))
    assert not status.available and words in status.reason and status.hint


def test_driver_but_no_device():
    probe, _, _ = probe_with()
    status = probe.open(Target(ME))
    assert not status.available and "sees no GPU" in status.reason


def test_devices_of_the_job_by_pid_then_by_visibility(monkeypatch):
    probe, clock, _ = probe_with(
        FakeGpu(uuid="GPU-aaa"), FakeGpu(uuid="GPU-bbb"), FakeGpu(uuid="GPU-ccc", job_pids=[ME])
    )
    probe.open(Target(ME))
    assert [s.labels["gpu"] for s in tick(probe, clock)] == ["2"]
    probe2, clock2, _ = probe_with(FakeGpu(uuid="GPU-aaa"), FakeGpu(uuid="GPU-bbb"))
    monkeypatch.setattr("gpudiag.probes.gpu.probe.visible_devices", lambda pid: ["GPU-bbb"])
    probe2.open(Target(ME))
    assert [s.labels["gpu"] for s in tick(probe2, clock2)] == ["1"]
    assert not probe2.matched_pid


def test_visible_devices_reads_the_job_environment():
    assert visible_devices(ME) == (
        os.environ["CUDA_VISIBLE_DEVICES"].split(",")
        if "CUDA_VISIBLE_DEVICES" in os.environ
        else None
    )


def test_real_pynvml_on_a_machine_without_gpu_is_unavailable():
    status = GpuProbe().open(Target(ME))
    if status.available:
        pytest.skip("this machine has an NVIDIA GPU")
    assert status.reason and status.hint


def test_job_in_another_pid_namespace_is_said_in_the_status(monkeypatch):
    monkeypatch.setattr("gpudiag.probes.gpu.probe.has_nvidia_device_open", lambda pids: True)
    probe, clock, _ = probe_with(FakeGpu(other_pids=[4242]))  # NVML sees only a foreign pid
    probe.open(Target(ME))
    s = tick(probe, clock)[0]
    assert s.values["job_uses_gpu"] == 1.0 and s.values["job_on_device"] == 0.0
    status = probe.final_status()
    assert status.available and "another PID namespace" in status.reason


def test_eight_gpus_in_one_pass_per_tick_with_maxima_read_once():
    gpus = [
        FakeGpu(
            uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", job_pids=[ME], util=const_pct(10 * i)
        )
        for i in range(8)
    ]
    probe, clock, fake = probe_with(*gpus)
    assert probe.open(Target(ME)).available
    ticks = [tick(probe, clock) for _ in range(3)]
    for samples in ticks:
        assert sorted(s.labels["gpu"] for s in samples) == [str(i) for i in range(8)]
        assert len({s.t_ns for s in samples}) == 1  # one pass: one time for all eight
        assert all(s.values["pcie_gen_max"] == 5.0 for s in samples)
    assert [s.values["util_gpu"] for s in ticks[-1]] == pytest.approx([i / 10 for i in range(8)])
    # maxima once per device; what changes, once per device per tick
    assert fake.calls["nvmlDeviceGetMaxPcieLinkGeneration"] == 8
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 16
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 24
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 24


def const_pct(v: float):
    return lambda t: v


def test_gpm_is_used_without_dcgm():
    gpm = {2: const_pct(60), 5: const_pct(30)}
    probe, clock, _ = probe_with(FakeGpu(job_pids=[ME], gpm=gpm))
    probe.dcgm = lambda: None
    assert probe.open(Target(ME)).available
    tick(probe, clock)
    (s,) = tick(probe, clock)
    assert s.values["gpm_sm_active"] == pytest.approx(0.6)
    assert "GPM off" not in (probe.final_status().reason or "")


def test_a_running_dcgm_exporter_turns_gpm_off_and_says_so():
    from gpudiag.probes.host.discovery import ProcInfo, dcgm_process

    box = [ProcInfo(7, 1, "dcgm-exporter", ("/usr/bin/dcgm-exporter",))]
    gpm = {2: const_pct(60), 5: const_pct(30)}
    probe, clock, fake = probe_with(FakeGpu(job_pids=[ME], gpm=gpm))
    probe.dcgm = lambda: f"{dcgm_process(box).name} (pid 7)"
    assert probe.open(Target(ME)).available
    tick(probe, clock)
    (s,) = tick(probe, clock)
    assert s.values.get("gpm_sm_active") is None  # fell back: no GPM sample taken
    assert fake.calls.get("nvmlGpmSampleGet", 0) == 0
    st = probe.final_status()
    assert st.available and "GPM off: dcgm-exporter (pid 7)" in st.reason
    assert "DCGM_FI_PROF" in st.hint
