"""A straggler rank slowed by its GPU: a throttled device or one shared with other processes,
named from that rank's own GPU figures (per-rank NVML sampling). Pure."""

from __future__ import annotations

from gpudiag.analyzers.model.results import Evidence
from gpudiag.analyzers.model.thresholds import Thresholds


def gpu_cause(
    gpu: str | None, stats: dict[str, float], th: Thresholds
) -> tuple[str, Evidence] | None:
    """The rank's GPU as its cause, in words, with the evidence; None when its GPU is fine or
    was not sampled."""
    if not stats:
        return None
    held = {k[len("throttle_") :]: v for k, v in stats.items() if k.startswith("throttle_")}
    worst = max(held.items(), key=lambda kv: kv[1], default=None)
    clock, top = stats.get("sm_clock_mhz"), stats.get("sm_clock_max_mhz")
    clocks = f", SM clock {clock:.0f} of {top:.0f} MHz" if clock and top else ""
    if worst is not None and worst[1] >= th.throttle_warn:
        return (
            f"its GPU {gpu} is throttled ({worst[0]} {worst[1]:.0%} of the time{clocks})",
            th.evidence(
                "throttle_warn", f"gpu{gpu}_throttle_{worst[0]}", worst[1], "share", ">=", "nvml"
            ),
        )
    others = stats.get("foreign_procs") or 0.0
    if others >= 0.5:  # present in at least half of the samples
        return (
            f"its GPU {gpu} is shared with {others:.0f} other process(es)",
            Evidence(f"gpu{gpu}_foreign_procs", others, "count", source="nvml"),
        )
    return None
