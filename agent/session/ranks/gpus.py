"""Each rank's GPU: which device (its CUDA context in NVML's process list, else its LOCAL_RANK
and CUDA_VISIBLE_DEVICES) and that device's figures over the run, from the GPU probe's samples
in the session's timeline (utilisation, SM activity, memory, clocks, throttling, other
processes)."""

from __future__ import annotations

from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.dist.ranks import RankInfo

FIELDS = (
    "util_gpu",
    "job_sm_util",
    "gpm_sm_active",
    "mem_used_bytes",
    "mem_total_bytes",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "foreign_procs",
    "power_w",
    "temperature_c",
)


def rank_device(info: RankInfo, pid_devices: dict[int, int]) -> tuple[str | None, str]:
    """The device index a rank runs on and how that is known ("nvml" or "env")."""
    if info.pid in pid_devices:
        return str(pid_devices[info.pid]), "nvml"
    if info.gpu is not None and info.gpu.isdigit():
        return info.gpu, "env"
    return info.gpu, "env" if info.gpu else "unknown"


def gpu_stats(tl: Timeline | None, index: str | None) -> dict[str, float]:
    """Means over the run of the device's GPU-probe series; {} when it was never sampled."""
    if tl is None or index is None:
        return {}
    out: dict[str, float] = {}
    for (probe, name, lk), roll in tl.series.items():
        if probe != "gpu" or dict(lk).get("gpu") != index or roll.mean is None:
            continue
        if name in FIELDS or name.startswith("throttle_"):
            out[name] = round(float(roll.mean), 4)
    return out
