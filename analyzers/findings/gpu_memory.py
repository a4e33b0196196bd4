"""MEM001 and MEM002: the job's VRAM use against the GPU's memory (headroom, near the limit)."""

from __future__ import annotations

import math

from gpudiag.analyzers.measures.gpu_stats import GIB, GpuStats, gpu_evidence
from gpudiag.analyzers.model.catalogue import Doc, Spec, new_finding, register
from gpudiag.analyzers.model.results import Finding, Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds

MEM001 = register(
    Spec(
        "MEM001",
        "VRAM headroom: the job uses a small share of GPU memory",
        "gpu",
        False,
        None,
        always_note=True,
        reads=("gpu_idle",),
        doc=Doc(
            means="VRAM headroom (note): measured peak vs capacity",
            fix="batch-size multiplier that still fits; the smaller GPU that holds peak + 25%",
        ),
    )
)

MEM002 = register(
    Spec(
        "MEM002",
        "VRAM near the limit",
        "gpu",
        False,
        None,
        reads=("gpu_idle",),
        doc=Doc(
            means="VRAM near the limit",
            fix="expandable segments, activation checkpointing, bf16",
        ),
    )
)


def memory_findings(st: GpuStats, th: Thresholds, sizing: str | None = None) -> list[Finding]:
    """MEM002 near the limit, MEM001 with room to use (`sizing`: the right-size line from the
    job's measured bound, which MEM001 points at)."""
    if not st.mem_peak or not st.mem_total:
        return []
    frac = st.mem_peak / st.mem_total
    peak_g, total_g = st.mem_peak / GIB, st.mem_total / GIB
    ev = (
        gpu_evidence(st, "vram_peak", peak_g, "GiB", source="nvml memory"),
        gpu_evidence(st, "vram_total", total_g, "GiB", source="nvml memory"),
    )
    if frac >= th.mem_near_limit:
        e = ev + (
            gpu_evidence(
                st,
                "vram_peak_share",
                frac,
                "ratio",
                threshold=th.mem_near_limit,
                comparison=">=",
                setting="mem_near_limit",
                source="nvml memory",
            ),
        )
        msg = (
            f"GPU {st.index} peaked at {peak_g:.1f} of {total_g:.1f} GiB ({frac:.0%}): one "
            "larger batch or a fragmented cache away from out-of-memory, and the caching "
            "allocator may be freeing and retrying (slow)."
        )
        actions = (
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation",
            "activation checkpointing (torch.utils.checkpoint) or a smaller batch with "
            "gradient accumulation",
            "bf16 autocast halves activation memory",
        )
        return [
            new_finding(
                "MEM002",
                th,
                confidence=0.8,
                impact=0.0,
                message=msg,
                evidence=e,
                recommendation=Recommendation("Leave memory headroom", actions),
                expected_speedup=1.0,
                signals=("nvml memory",),
                speedup_basis="none: a risk to the run (out of memory), not lost time",
            )
        ]
    if frac > th.mem_headroom_max:
        return []
    mult = max(1, math.floor(0.85 * st.mem_total / st.mem_peak))
    e = ev + (
        gpu_evidence(
            st,
            "vram_peak_share",
            frac,
            "ratio",
            threshold=th.mem_headroom_max,
            comparison="<=",
            setting="mem_headroom_max",
            source="nvml memory",
        ),
    )
    msg = (
        f"The job peaks at {peak_g:.1f} GiB of GPU {st.index}'s {total_g:.0f} GiB "
        f"({frac:.0%}). About {mult}x the batch would still fit (activations scale with "
        "batch size, weights do not; so this is an upper estimate)"
        + (f". Right-size (model, from the job's measured bound): {sizing}." if sizing else ".")
    )
    fixes = [
        f"raise the batch size up to ~{mult}x (scale the learning rate with it), "
        "watching VRAM with gpudiag"
    ]
    if sizing:
        fixes.append(f"or run on a cheaper GPU: {sizing}")
    return [
        new_finding(
            "MEM001",
            th,
            confidence=0.8,
            impact=0.0,
            message=msg,
            evidence=e,
            recommendation=Recommendation(
                f"Use the memory: batch up to ~{mult}x" + (", or a cheaper GPU" if sizing else ""),
                tuple(fixes),
            ),
            expected_speedup=1.0,
            signals=("nvml memory",),
            speedup_basis="none here: a larger batch may raise throughput; measure it",
        )
    ]
