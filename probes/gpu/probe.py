"""GPU probe: what the job's GPUs do, through NVML.

Which GPUs are the job's: the devices whose NVML process lists hold the job's pid or one of
its children; until the job has a CUDA context (or when its pids are in another namespace),
the devices it can see through its CUDA_VISIBLE_DEVICES (matched by index or UUID).
Counters that exist as NVML field values (PCIe bytes, throttle time) are read as cumulative
totals, so shares come from exact deltas, not from point samples.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psutil

from gpudiag.probes.base import Field, Probe, ProbeStatus, Sample, Target, now_ns
from gpudiag.probes.gpu.counters import THROTTLE_REASONS, field_counters, gpm_metrics
from gpudiag.probes.gpu.device import STATIC_QUERIES, TICK_QUERIES, Device
from gpudiag.probes.gpu.device import text as _text
from gpudiag.probes.gpu.nvml import GpuLost, Nvml, NvmlNotFound
from gpudiag.probes.gpu.visibility import has_nvidia_device_open, visible_devices
from gpudiag.probes.host.discovery import DCGM_HINT, DCGM_NOTE, dcgm_running


class GpuProbe(Probe):
    """Samples the job's GPUs through one Nvml layer."""

    name = "gpu"
    interval_s = 1.0
    fields = (
        Field("util_gpu", "ratio", "gauge", "NVML utilisation: share of time any kernel ran"),
        Field("util_mem", "ratio", "gauge", "share of time device memory was read or written"),
        Field("mem_used_bytes", "bytes", "gauge", "device memory used (v2 struct)"),
        Field("mem_total_bytes", "bytes", "gauge", "device memory"),
        Field("job_mem_bytes", "bytes", "gauge", "device memory held by the job's processes"),
        Field("job_sm_util", "ratio", "gauge", "SM utilisation of the job's processes"),
        Field("job_on_device", "ratio", "gauge", "1 when an NVML process of the job is here"),
        Field("foreign_procs", "count", "gauge", "compute processes on the GPU not the job's"),
        Field(
            "job_uses_gpu",
            "ratio",
            "gauge",
            "1 when the job is in NVML's process list or holds /dev/nvidiaN open",
        ),
        Field("pcie_tx_bytes_per_s", "bytes/s", "gauge", "PCIe bytes sent by the GPU"),
        Field("pcie_rx_bytes_per_s", "bytes/s", "gauge", "PCIe bytes received by the GPU"),
        Field("pcie_gen", "gen", "gauge", "current PCIe link generation"),
        Field("pcie_gen_max", "gen", "gauge", "maximum PCIe link generation"),
        Field("pcie_width", "lanes", "gauge", "current PCIe link width"),
        Field("pcie_width_max", "lanes", "gauge", "maximum PCIe link width"),
        Field("sm_clock_mhz", "MHz", "gauge", "SM clock"),
        Field("sm_clock_max_mhz", "MHz", "gauge", "maximum SM clock"),
        Field("mem_clock_mhz", "MHz", "gauge", "memory clock"),
        Field("mem_clock_max_mhz", "MHz", "gauge", "maximum memory clock"),
        Field("temperature_c", "°C", "gauge", "GPU temperature"),
        Field("power_w", "W", "gauge", "power draw"),
        Field("power_limit_w", "W", "gauge", "enforced power limit"),
        Field("power_default_limit_w", "W", "gauge", "the board's default power limit"),
        Field("ecc_uncorrected", "count", "counter", "volatile uncorrected ECC errors"),
        Field("lost", "ratio", "gauge", "1 when the GPU stopped answering"),
        *(
            Field(f"throttle_{r}", "ratio", "gauge", f"share of time clocks were held by {r}")
            for r in THROTTLE_REASONS
        ),
        Field("gpm_sm_active", "ratio", "gauge", "GPM: share of SMs busy (Hopper+)"),
        Field("gpm_sm_occupancy", "ratio", "gauge", "GPM: warp occupancy (Hopper+)"),
        Field("gpm_tensor_active", "ratio", "gauge", "GPM: tensor-core activity (Hopper+)"),
        Field("gpm_dram_bw", "ratio", "gauge", "GPM: DRAM bandwidth used (Hopper+)"),
        Field("gpm_pcie_tx_mib_s", "MiB/s", "gauge", "GPM: PCIe TX (Hopper+)"),
        Field("gpm_pcie_rx_mib_s", "MiB/s", "gauge", "GPM: PCIe RX (Hopper+)"),
    )

    def __init__(
        self,
        nvml: Nvml | None = None,
        interval_s: float = 1.0,
        clock_ns: Callable[[], int] = now_ns,
        dcgm: Callable[[], str | None] | None = None,
    ) -> None:
        self.nvml = nvml or Nvml()
        self.dcgm = dcgm or dcgm_running
        self.dcgm_seen: str | None = None  # the DCGM process that turned GPM off
        self.clock_ns = clock_ns
        self.interval_s = interval_s
        self.target: Target | None = None
        self.devices: list[Device] = []
        self.visible: list[str] | None = None
        self.driver: str | None = None
        self.errors: list[str] = []
        self.matched_pid = False
        self.used_without_pid_match = False
        self.used_gpu = False
        self._status: ProbeStatus | None = None
        self.extra_pids: set[int] = set()  # a distributed job's other ranks (not children)
        self.pid_devices: dict[int, int] = {}  # job pid -> the device its CUDA context is on

    # ---- setup ----------------------------------------------------------------------
    def open(self, target: Target) -> ProbeStatus:
        """Initialise NVML and list the devices; unavailable (with why) on a GPU-less box."""
        self.target = target
        status = self.nvml.init(self.name)
        if not status.available:
            self._status = status
            return status
        n = self.nvml
        self.driver = _text(n.call("nvmlSystemGetDriverVersion"))
        count = n.call("nvmlDeviceGetCount") or 0
        for i in range(count):
            try:
                h = n.call("nvmlDeviceGetHandleByIndex", i, device=i)
                if h is None:
                    continue
                mem = self._memory(h, i)
                self.devices.append(
                    Device(
                        i,
                        h,
                        _text(n.call("nvmlDeviceGetUUID", h, device=i)) or f"GPU-{i}",
                        _text(n.call("nvmlDeviceGetName", h, device=i)) or "NVIDIA GPU",
                        float(mem.total) if mem is not None else None,
                    )
                )
            except GpuLost as exc:
                self.errors.append(f"GPU {i} lost while starting: {exc}")
        self.visible = visible_devices(target.pid)
        self.dcgm_seen = self.dcgm() if self.devices else None
        for d in self.devices if self.dcgm_seen is None else ():
            self._init_gpm(d)
        self._status = ProbeStatus(self.name, True)
        return self._status

    def _memory(self, handle: Any, i: int) -> Any:
        v2 = getattr(self.nvml.mod, "nvmlMemory_v2", None)
        if v2 is not None:
            mem = self.nvml.call(
                "nvmlDeviceGetMemoryInfo", handle, v2, device=i, what="nvmlDeviceGetMemoryInfo(v2)"
            )
            if mem is not None:
                return mem
        return self.nvml.call("nvmlDeviceGetMemoryInfo", handle, device=i)

    def _init_gpm(self, d: Device) -> None:
        m = self.nvml.mod
        sup = self.nvml.call("nvmlGpmQueryDeviceSupport", d.handle, device=d.index)
        if sup is None or not getattr(sup, "isSupportedDevice", 0):
            return
        sample = self.nvml.call("nvmlGpmSampleAlloc", device=d.index)
        if (
            sample is not None
            and self.nvml.call("nvmlGpmSampleGet", d.handle, sample, device=d.index) is not None
        ):
            d.gpm_prev, d.gpm_ok = sample, hasattr(m, "c_nvmlGpmMetricsGet_t")

    def candidate_devices(self) -> list[Device]:
        """The devices the job can see (CUDA_VISIBLE_DEVICES by index or UUID)."""
        if self.visible is None:
            return [d for d in self.devices if not d.lost]
        out = []
        for v in self.visible:
            for d in self.devices:
                if (v.isdigit() and int(v) == d.index) or (
                    v.startswith("GPU-") and d.uuid.startswith(v)
                ):
                    out.append(d)
        return [d for d in out if not d.lost]

    def problems(self) -> list[str]:
        """GPUs lost while starting or sampling."""
        return list(self.errors)

    def describe(self) -> dict:
        """Driver and GPUs for the report's environment."""
        return {
            "driver": self.driver,
            "gpus": [
                {
                    "index": d.index,
                    "name": d.name,
                    "uuid": d.uuid,
                    "memory_total_bytes": d.memory_total,
                }
                for d in self.devices
            ],
        }

    def final_status(self) -> ProbeStatus:
        """The probe's status at the end, with what turned out not to be available."""
        st = self._status or ProbeStatus(self.name, False, "not opened")
        if not st.available:
            return st
        notes, hints = [], []
        if self.nvml.unsupported:
            missing = sorted({k.split("@")[0] for k in self.nvml.unsupported})
            notes.append("not available on this GPU/driver: " + ", ".join(missing))
            if any("Gpm" in k for k in missing):
                hints.append("GPM metrics need a Hopper or newer GPU and a recent driver")
        if self.dcgm_seen is not None:
            notes.append(f"GPM off: {self.dcgm_seen} runs here ({DCGM_NOTE})")
            hints.append(DCGM_HINT)
        if self.used_without_pid_match and not self.matched_pid:
            # (a job opens /dev/nvidia* a moment before NVML lists its context: a pid that
            # matched later means the namespaces agree)
            notes.append(
                "the job holds a GPU open but none of its pids is in NVML's process "
                "lists (another PID namespace, e.g. a container): sampled the "
                "devices it can see (CUDA_VISIBLE_DEVICES)"
            )
            hints.append(
                "run gpudiag in the job's PID namespace (same container) for "
                "per-process GPU figures"
            )
        if not notes:
            return st
        return ProbeStatus(self.name, True, "; ".join(notes), "; ".join(hints) or None)

    # ---- sampling -------------------------------------------------------------------
    def _job_pids(self) -> set[int]:
        assert self.target is not None
        pids = {self.target.pid} | self.extra_pids
        try:
            pids |= {p.pid for p in psutil.Process(self.target.pid).children(recursive=True)}
        except psutil.Error:
            pass
        return pids

    def sample(self) -> list[Sample]:
        """One tick for each of the job's devices."""
        t = self.clock_ns()
        pids = self._job_pids()
        per_dev: dict[int, dict] = {}
        for d in self.devices:
            if d.lost:
                continue
            try:
                per_dev[d.index] = self._processes(d, pids)
            except GpuLost as exc:
                self._lose(d, exc)
        on_job = [i for i, p in per_dev.items() if p["job_on_device"]]
        if on_job:
            self.matched_pid = True
        chosen = [d for d in self.devices if d.index in on_job] or self.candidate_devices()
        # scanning the job's open files is done only until it is seen using a GPU
        if not (on_job or self.used_gpu):
            self.used_gpu = has_nvidia_device_open(pids)
        uses = 1.0 if on_job or self.used_gpu else 0.0
        if uses and not on_job and not self.matched_pid:
            self.used_without_pid_match = True
        out = []
        for d in chosen:
            if d.lost:
                continue
            labels = {"gpu": str(d.index), "uuid": d.uuid, "name": d.name}
            try:
                values = self._device_values(d, t)
                values.update(per_dev.get(d.index, {}))
                values["job_uses_gpu"] = uses
            except GpuLost as exc:
                self._lose(d, exc)
                values = {"lost": 1.0}
            out.append(Sample(self.name, t, labels, values))
        return out

    def watch_box(self) -> None:
        """Sample every device of the box from now on, not only the job's (`gpudiag top`)."""
        self.visible = None

    def compute_processes(self) -> dict[int, list[tuple[int, float]]]:
        """Every compute process on the devices: pid -> [(device index, GPU memory bytes)]."""
        out: dict[int, list[tuple[int, float]]] = {}
        for d in self.devices:
            procs = (
                self.nvml.call("nvmlDeviceGetComputeRunningProcesses", d.handle, device=d.index)
                or []
            )
            for p in procs:
                out.setdefault(p.pid, []).append(
                    (d.index, float(getattr(p, "usedGpuMemory", 0) or 0))
                )
        return out

    def _lose(self, d: Device, exc: GpuLost) -> None:
        d.lost = True
        self.errors.append(f"GPU {d.index} ({d.uuid}) lost: {exc}; sampling the others")

    def _processes(self, d: Device, pids: set[int]) -> dict:
        n = self.nvml
        procs = n.call("nvmlDeviceGetComputeRunningProcesses", d.handle, device=d.index) or []
        job_mem = 0.0
        mine = foreign = 0
        for p in procs:
            if p.pid in pids:
                mine += 1
                job_mem += float(getattr(p, "usedGpuMemory", 0) or 0)
                self.pid_devices[p.pid] = d.index
            else:
                foreign += 1
        vals: dict[str, float | None] = {
            "job_on_device": 1.0 if mine else 0.0,
            "foreign_procs": float(foreign),
        }
        if mine:
            vals["job_mem_bytes"] = job_mem
        try:
            util = n.call(
                "nvmlDeviceGetProcessUtilization", d.handle, d.last_seen_us, device=d.index
            )
            if util is not None:
                sm = [u.smUtil for u in util if u.pid in pids]
                if util:
                    d.last_seen_us = max(int(u.timeStamp) for u in util)
                vals["job_sm_util"] = min(1.0, sum(sm) / 100.0) if sm else 0.0
        except NvmlNotFound:
            vals["job_sm_util"] = 0.0  # no process ran in the window: zero, not an error
        return vals

    def _device_values(self, d: Device, t: int) -> dict[str, float | None]:
        n, h, i = self.nvml, d.handle, d.index
        v: dict[str, float | None] = {"lost": 0.0}
        util = n.call("nvmlDeviceGetUtilizationRates", h, device=i)
        if util is not None:
            v["util_gpu"], v["util_mem"] = util.gpu / 100.0, util.memory / 100.0
        mem = self._memory(h, i)
        if mem is not None:
            v["mem_used_bytes"], v["mem_total_bytes"] = float(mem.used), float(mem.total)
        if d.static is None:  # maxima do not change while the driver runs: one query each
            d.static = self._queries(d, STATIC_QUERIES)
        v.update(d.static)
        v.update(self._queries(d, TICK_QUERIES))
        power = n.call("nvmlDeviceGetPowerUsage", h, device=i)
        limit = n.call("nvmlDeviceGetEnforcedPowerLimit", h, device=i)
        v["power_w"] = power / 1000.0 if power is not None else None
        v["power_limit_w"] = limit / 1000.0 if limit is not None else None
        default = n.call("nvmlDeviceGetPowerManagementDefaultLimit", h, device=i)
        if default is not None:
            v["power_default_limit_w"] = default / 1000.0
        ecc = n.call("nvmlDeviceGetTotalEccErrors", h, 1, 0, device=i)  # uncorrected, volatile
        if ecc is not None:
            v["ecc_uncorrected"] = float(ecc)
        field_counters(self.nvml, d, t, v)
        gpm_metrics(self.nvml, d, v)
        return v

    def _queries(
        self, d: Device, queries: tuple[tuple[str, str, int | None], ...]
    ) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for key, fn, arg in queries:
            args = (d.handle,) if arg is None else (d.handle, arg)
            val = self.nvml.call(
                fn, *args, device=d.index, what=f"{fn}({arg})" if arg is not None else fn
            )
            if val is not None:
                out[key] = float(val)
        return out

    def close(self) -> None:
        """Shut NVML down."""
        self.nvml.shutdown()


def hardware_summary(nvml: Nvml | None = None) -> dict:
    """Driver and GPUs of this machine ({} without NVML): for a recording's header, which is
    written before the session's GPU probe opens."""
    probe = GpuProbe(nvml or Nvml())
    try:
        if not probe.open(Target(os.getpid())).available:
            return {}
        return probe.describe()
    except Exception:  # noqa: BLE001 - a header fact, never worth failing a run for
        return {}
    finally:
        probe.close()
