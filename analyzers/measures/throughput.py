"""Exact throughput from the in-process hooks: steps, samples, step-time percentiles, waits."""

from __future__ import annotations

from gpudiag.analyzers.timeline.rollup import Rollup
from gpudiag.analyzers.timeline.timeline import Aggregate

THROUGHPUT_UNITS = {
    "steps": "count",
    "steps_per_second": "1/s",
    "samples_per_second": "samples/s",
    "step_time_p50_s": "s",
    "step_time_p95_s": "s",
    "step_time_max_s": "s",
    "data_wait_ratio": "ratio",
    "data_wait_per_step_s": "s",
    "h2d_copy_per_step_s": "s",
    "h2d_pinned_ratio": "ratio",
    "syncs_per_step": "count",
    "sync_time_ratio": "ratio",
    "cuda_allocated_bytes": "bytes",
    "cuda_reserved_bytes": "bytes",
    "cuda_peak_bytes": "bytes",
    "cuda_alloc_retries": "count",
    "cuda_fragmentation_ratio": "ratio",
}


def _roll(tl: Aggregate, name: str, kind: str = "step") -> Rollup | None:
    return tl.rollup("hooks", name, kind=kind)


def throughput_metrics(tl: Aggregate) -> dict[str, float | None]:
    """Metrics from the hooks; empty when the run had none (attach without instrument())."""
    st = _roll(tl, "step_time_s")
    first = _roll(tl, "first_step")
    if st is None and first is None:
        return {}
    n = st.count if st else 0
    steps = n + (first.count if first else 0)
    out: dict[str, float | None] = {"steps": float(steps)}
    if not st or n == 0 or st.total <= 0:
        return out
    span = st.total

    def total(name: str) -> float:
        r = _roll(tl, name)
        return r.total if r else 0.0

    batch = total("batch_size")
    pinned, pageable = total("h2d_pinned"), total("h2d_pageable")
    out.update(
        {
            "steps_per_second": n / span,
            "samples_per_second": batch / span if batch else None,
            "step_time_p50_s": st.quantile(0.5),
            "step_time_p95_s": st.quantile(0.95),
            "step_time_max_s": st.maximum,
            "data_wait_ratio": total("data_wait_s") / span,
            "data_wait_per_step_s": total("data_wait_s") / n,
            "h2d_copy_per_step_s": total("h2d_copy_s") / n,
            "h2d_pinned_ratio": pinned / (pinned + pageable) if pinned + pageable else None,
            "syncs_per_step": total("syncs") / n,
            "sync_time_ratio": total("sync_time_s") / span,
        }
    )
    mem = {
        k: _roll(tl, k, "cuda_mem")
        for k in ("allocated", "reserved", "peak", "alloc_retries", "inactive_split")
    }
    if mem["peak"] is not None:
        out["cuda_allocated_bytes"] = mem["allocated"].last if mem["allocated"] else None
        out["cuda_reserved_bytes"] = mem["reserved"].maximum if mem["reserved"] else None
        out["cuda_peak_bytes"] = mem["peak"].maximum
        out["cuda_alloc_retries"] = mem["alloc_retries"].maximum if mem["alloc_retries"] else None
        split, reserved = mem["inactive_split"], mem["reserved"]
        if split and split.last is not None and reserved and reserved.last:
            out["cuda_fragmentation_ratio"] = split.last / reserved.last
    return out


def sync_sites(tl: Aggregate) -> list[tuple[str, float]]:
    """Call sites of host-device syncs (sampled), most frequent first."""
    sites = [(d["site"], r.total) for d, r in tl.matching("hooks", "count", kind="sync_site")]
    return sorted(sites, key=lambda s: -s[1])
