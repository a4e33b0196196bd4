"""Per-GPU statistics of the loop window from NVML samples, and the GPU-wide shares other
analyzers use (the job's GPU idle, a saturated link, the compute share)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpudiag.analyzers.model.results import Evidence
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.rollup import Rollup
from gpudiag.analyzers.timeline.timeline import Aggregate

NVML_ONLY_CONFIDENCE = 0.6
CONFIRMED_CONFIDENCE = 0.9
GIB = 2**30
# PCIe payload bandwidth per lane and direction, GB/s, by generation.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass
class GpuStats:
    """What one of the job's GPUs did over the run."""

    index: str
    name: str
    samples: int = 0
    busy: float | None = None  # NVML utilisation, mean
    job_sm: float | None = None  # per-process SM utilisation of the job, mean
    sm_active: float | None = None  # GPM
    tensor_active: float | None = None  # GPM
    dram_bw: float | None = None  # GPM: share of peak DRAM bandwidth used
    mem_peak: float | None = None
    mem_total: float | None = None
    pcie_rx: float | None = None
    pcie_tx: float | None = None
    pcie_gen: float | None = None
    pcie_gen_max: float | None = None
    pcie_width: float | None = None
    pcie_width_max: float | None = None
    sm_clock: float | None = None
    sm_clock_max: float | None = None
    gpm_pcie_rx: float | None = None  # bytes/s, GPM (Hopper+)
    power_w: float | None = None
    power_limit: float | None = None
    power_default: float | None = None
    throttle: dict[str, float] = field(default_factory=dict)
    lost: bool = False
    job_uses_gpu: bool = True

    @property
    def idle(self) -> float | None:
        """Share of time no kernel of anyone ran (1 - NVML utilisation)."""
        return None if self.busy is None else max(0.0, 1.0 - self.busy)

    @property
    def rx(self) -> float:
        """Host-to-device bytes/s: GPM's counter where there is one, else NVML's."""
        return self.gpm_pcie_rx if self.gpm_pcie_rx is not None else (self.pcie_rx or 0.0)

    def link_capacity(self) -> float | None:
        """Current PCIe link's payload bandwidth per direction, bytes/s."""
        if not self.pcie_gen or not self.pcie_width:
            return None
        return PCIE_LANE_GBPS.get(int(self.pcie_gen), 0.0) * self.pcie_width * 1e9


# a 'gpu' series -> the GpuStats field it sets and the rollup value it takes
_FIELD_OF = {
    "job_sm_util": ("job_sm", "mean"),
    "gpm_sm_active": ("sm_active", "mean"),
    "gpm_tensor_active": ("tensor_active", "mean"),
    "gpm_dram_bw": ("dram_bw", "mean"),
    "mem_total_bytes": ("mem_total", "maximum"),
    "pcie_rx_bytes_per_s": ("pcie_rx", "mean"),
    "pcie_tx_bytes_per_s": ("pcie_tx", "mean"),
    "pcie_gen": ("pcie_gen", "minimum"),
    "pcie_width": ("pcie_width", "minimum"),
    "pcie_gen_max": ("pcie_gen_max", "maximum"),
    "pcie_width_max": ("pcie_width_max", "maximum"),
    "power_w": ("power_w", "mean"),
    "power_limit_w": ("power_limit", "minimum"),
    "power_default_limit_w": ("power_default", "maximum"),
    "sm_clock_mhz": ("sm_clock", "mean"),
    "sm_clock_max_mhz": ("sm_clock_max", "maximum"),
}


def gpu_stats(tl: Aggregate) -> list[GpuStats]:
    """Per-GPU statistics from the timeline's 'gpu' series."""
    out: dict[str, GpuStats] = {}
    job_mem: dict[str, float] = {}
    for (probe, name, lk), roll in tl.series.items():
        if probe != "gpu":
            continue
        labels = dict(lk)
        st = out.setdefault(
            labels.get("gpu", "?"), GpuStats(labels.get("gpu", "?"), labels.get("name", "GPU"))
        )
        if name in _FIELD_OF:
            attr, stat = _FIELD_OF[name]
            setattr(st, attr, getattr(roll, stat))
        elif name == "job_mem_bytes":
            job_mem[st.index] = roll.maximum
        else:
            _other_series(st, name, roll)
    # the job's own memory is what matters; the device's used memory is the fallback
    for index, peak in job_mem.items():
        out[index].mem_peak = peak
    return [out[k] for k in sorted(out, key=lambda x: (len(x), x))]


def _other_series(st: GpuStats, name: str, roll: Rollup) -> None:
    """The series that are not one field's mean, minimum or peak."""
    mean, peak = roll.mean, roll.maximum
    if name == "util_gpu":
        st.busy, st.samples = mean, roll.count
    elif name == "mem_used_bytes":
        st.mem_peak = peak if st.mem_peak is None else st.mem_peak
    elif name == "gpm_pcie_rx_mib_s":
        st.gpm_pcie_rx = mean * 1048576.0 if mean is not None else None
    elif name.startswith("throttle_"):
        st.throttle[name[len("throttle_") :]] = mean or 0.0
    elif name == "lost" and peak and peak > 0:
        st.lost = True
    elif name == "job_uses_gpu":
        st.job_uses_gpu = bool(peak)


def confidence(st: GpuStats, base: float = NVML_ONLY_CONFIDENCE) -> float:
    """Higher when GPM SM activity confirms what NVML utilisation says."""
    return CONFIRMED_CONFIDENCE if st.sm_active is not None else base


def gpu_evidence(st: GpuStats, name: str, value: float | None, unit: str, **kw: Any) -> Evidence:
    """Evidence of one GPU: the metric named `name[gpuN]`, its value rounded."""
    return Evidence(
        f"{name}[gpu{st.index}]", None if value is None else round(value, 4), unit, **kw
    )


def job_gpu_idle(stats: list[GpuStats]) -> tuple[float | None, tuple[str, ...]]:
    """Mean idle share of the GPUs the job uses, and the signals it rests on."""
    used = [st for st in stats if st.job_uses_gpu and st.idle is not None and not st.lost]
    if not used:
        return None, ()
    signals = ("nvml utilization",) + (
        ("nvml gpm",) if any(st.sm_active is not None for st in used) else ()
    )
    return sum(st.idle for st in used if st.idle is not None) / len(used), signals


def link_bound(stats: list[GpuStats], th: Thresholds) -> float:
    """GPU idle while a saturated PCIe link feeds it (0 when no link is near capacity)."""
    worst = 0.0
    for st in stats:
        cap = st.link_capacity()
        if (
            cap
            and st.busy is not None
            and st.rx >= th.pcie_saturation * cap
            and st.busy < th.pcie_busy_max
        ):
            worst = max(worst, 1.0 - st.busy)
    return worst


def gpu_compute(stats: list[GpuStats]) -> float | None:
    """Share of time the job's GPUs compute: between GPM SM activity (a lower bound, SMs
    idle inside kernels) and NVML utilisation (an upper bound, it counts copies)."""
    used = [st for st in stats if st.job_uses_gpu and st.busy is not None and not st.lost]
    if not used:
        return None
    vals = [
        (busy + st.sm_active) / 2 if st.sm_active is not None else busy
        for st in used
        if (busy := st.busy) is not None
    ]
    return sum(vals) / len(vals)
