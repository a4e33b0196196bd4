"""The distributed findings built: DIST001 (a straggler and the ranks that wait for it) and
DIST003 (every rank communication-bound), with their evidence, fix and speed-up."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpudiag.analyzers.distributed.gpu import gpu_cause
from gpudiag.analyzers.distributed.ranks import (
    CAUSES,
    RANK_PARTS,
    RankStats,
    label,
    location,
    wait_share,
)
from gpudiag.analyzers.model.catalogue import Doc, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.model.thresholds import Thresholds

DIST001 = register(
    Spec(
        "DIST001",
        "A straggler rank makes the other ranks wait in collectives",
        "distributed",
        False,
        time_in="collective",
        compares_ranks=True,
        doc=Doc(
            means=(
                "a straggler rank makes the others wait in collectives: told by where each rank "
                "waits (measured by the collective hooks and DDP's timing comm hook; else "
                "inferred from the stacks), with its host, GPU and own cause (its own loop work, "
                "its DataLoader, its compute or its throttled/shared GPU, copies, checkpoints) "
                "and its location"
            ),
            fix=(
                "what the others lose per step and the speed-up if it kept pace; the fix for its "
                "own cause"
            ),
        ),
    )
)

DIST003 = register(
    Spec(
        "DIST003",
        "Communication-bound: every rank spends a large share of its step in collectives",
        "distributed",
        False,
        time_in="collective",
        compares_ranks=True,
        doc=Doc(
            means=(
                "communication-bound: every rank spends `dist_comm_warn` or more of its step in "
                "collectives, no straggler"
            ),
            fix=(
                "gradient accumulation with `no_sync`, `bucket_cap_mb`, FSDP prefetch/sharding, "
                "ZeRO `overlap_comm` and bucket sizes, NCCL hints for PCIe-only GPUs"
            ),
        ),
    )
)


@dataclass(frozen=True)
class Straggler:
    """A straggler and the ranks that wait for it. `lost`: their extra wait, as a share of the
    step; `hidden`: the wait inferred under DDP's backward; `wait` gives a rank's share in
    collectives (the stacks' by default, the hooks' when measured) and `parts` the parts its
    cause is read from (None: too few stack samples to name it)."""

    culprit: RankStats
    victims: list[RankStats]
    lost: float
    hidden: bool = False
    wait: Callable[[RankStats], float] | None = None
    parts: dict[int, dict[str, float]] | None = None


@dataclass(frozen=True)
class _Cause:
    """The straggler's own cause: the part it spends more on (`own`), in words, its GPU's
    evidence when that is the cause, and the others' mean parts."""

    own: str
    words: str
    by_gpu: tuple[str, Evidence] | None
    mean: dict[str, float]


def dist001(s: Straggler, th: Thresholds) -> Finding:
    """DIST001 for the straggler `s.culprit`."""
    wait = s.wait or wait_share
    got = s.parts or {r.rank: r.parts for r in [s.culprit, *s.victims]}
    c = _cause(s, wait, got, th)
    culprit = s.culprit
    share = got[culprit.rank].get(c.own, 0.0)
    msg = f"{label(culprit)} is the straggler: {_where(s, wait, got)}. Its own cause: {c.words}"
    if s.parts is not None or wait is wait_share:
        msg += f" ({c.own} {share:.0%} of its step vs {c.mean[c.own]:.0%} on the others)"
        loc = culprit.locations.get(c.own) or culprit.location
        msg += f", at {loc}" if loc else ""
    msg += f". If it kept pace, every rank would step {speedup_from_impact(s.lost):.2f}x faster."
    return new_finding(
        "DIST001",
        th,
        confidence=_confidence(s, wait, th),
        impact=min(1.0, s.lost),
        message=msg,
        evidence=(
            th.evidence(
                "dist_straggler_gap",
                "rank_collective_wait_gap",
                round(s.lost, 4),
                "share",
                ">=",
                "stacks" if wait is wait_share else "hooks",
            ),
            Evidence(f"rank{culprit.rank}_{c.own}_share", share, "share"),
            Evidence(f"rank{culprit.rank}_collective_share", wait(culprit), "share"),
            *((c.by_gpu[1],) if c.by_gpu else ()),
        ),
        recommendation=Recommendation(
            f"Make rank {culprit.rank} keep pace", _actions(culprit, c.own)
        ),
        expected_speedup=speedup_from_impact(s.lost),
        location=location(culprit.locations.get(c.own) or culprit.location),
        signals=("stacks", "hooks") if culprit.step_time_s else ("stacks",),
        speedup_basis="the others' extra wait in collectives removed: every rank steps at "
        "the pace of the victims' work",
    )


def _cause(
    s: Straggler,
    wait: Callable[[RankStats], float],
    got: dict[int, dict[str, float]],
    th: Thresholds,
) -> _Cause:
    """The part the straggler spends more on than the others, or its GPU."""
    culprit, victims = s.culprit, s.victims
    mean = {
        p: sum(got[v.rank].get(p, 0.0) for v in victims) / len(victims)
        for p in RANK_PARTS
        if p != "collectives"
    }
    excess = {
        p: got[culprit.rank].get(p, 0.0) - m
        for p, m in mean.items()
        if not (s.hidden and p == "compute")
    }
    own, extra = max(excess.items(), key=lambda kv: kv[1])
    cause = CAUSES[own] if extra > 0 else "its own cause is not visible in its stacks"
    if wait is not wait_share and s.parts is None:
        cause = f"not named: fewer than {th.dist_min_rank_samples} stack samples of a rank's loop"
    no_stacks = wait is not wait_share and s.parts is None
    by_gpu = (
        gpu_cause(culprit.gpu, culprit.gpu_stats, th) if own == "compute" or no_stacks else None
    )
    if by_gpu is not None:
        cause, own = by_gpu[0], "compute"
    return _Cause(own, cause, by_gpu, mean)


def _where(s: Straggler, wait: Callable[[RankStats], float], got: dict) -> str:
    """Who waits for the straggler, how long, and how that is known."""
    culprit, lost = s.culprit, s.lost
    names = ", ".join(str(v.rank) for v in s.victims)
    step = culprit.step_time_s
    per_step = f" ({lost * step * 1e3:.0f} ms of every {step * 1e3:.0f} ms step)" if step else ""
    if wait is not wait_share:
        under = any(
            v.parts.get("compute", 0.0) > got[v.rank].get("compute", 0.0) for v in s.victims
        )
        return (
            f"rank(s) {names} wait for it inside collectives {lost:.0%} of their step more "
            f"than it does{per_step}, measured by gpudiag's collective hooks"
            + (" (DDP's all-reduce, hidden under their backward)" if under else "")
            + f"; it waits only {wait(culprit):.0%} of its step"
        )
    if s.hidden:
        return (
            f"rank(s) {names} wait for it: their compute share is {lost:.0%} of the step "
            f"larger than its own{per_step}, the wait DDP's all-reduce hides under backward "
            "(inferred: no stack shows the collective)"
        )
    return (
        f"rank(s) {names} wait for it inside collectives {lost:.0%} of their step more "
        f"than it does{per_step}; it waits in collectives only {wait_share(culprit):.0%} of "
        "its step"
    )


def _actions(culprit: RankStats, own: str) -> tuple[str, ...]:
    """What to change on the straggler, by the part that makes it late."""
    return {
        "data": (
            f"on rank {culprit.rank}: raise DataLoader num_workers, set pin_memory=True and "
            "persistent_workers=True; check that its data shard is not larger or on slower storage",
        ),
        "compute": (
            f"check rank {culprit.rank}'s GPU {culprit.gpu or '?'} for throttling "
            "(`nvidia-smi -q -d PERFORMANCE`) and for other processes on it (`nvidia-smi`)",
            "balance the work per rank (equal batch sizes and sequence lengths)",
        ),
        "other": (
            f"on rank {culprit.rank}: move the per-step work at "
            f"{culprit.locations.get('other') or 'its loop'} into the DataLoader (Dataset "
            "__getitem__ or collate_fn, with num_workers > 0) or make it the same on every rank",
        ),
    }.get(own, (f"profile rank {culprit.rank} alone: `gpudiag attach {culprit.pid}`",))


def _confidence(s: Straggler, wait: Callable[[RankStats], float], th: Thresholds) -> float:
    """How likely the smallest gap is above the threshold, from the samples (or the timed
    steps) behind it."""
    culprit = s.culprit
    v = min(s.victims, key=wait)
    p1, p2 = wait(v), wait(culprit)
    n1, n2 = (
        (v.steps or 1, culprit.steps or 1)
        if wait is not wait_share
        else (v.samples, culprit.samples)
    )
    se = math.sqrt(p1 * (1 - p1) / max(1, n1) + p2 * (1 - p2) / max(1, n2))
    if s.hidden:
        p1, p2 = s.lost, 0.0
    z = (p1 - p2 - th.dist_straggler_gap) / max(se, 1e-6)
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def dist003(ranks: list[RankStats], th: Thresholds, wait: Any = None) -> Finding:
    wait = wait or wait_share
    share = min(wait(r) for r in ranks)
    k = 4
    speedup = speedup_from_impact(share * (k - 1) / k)
    return new_finding(
        "DIST003",
        th,
        confidence=0.8,
        impact=share,
        message=(
            f"every rank spends at least {share:.0%} of its step inside collectives and no "
            "rank is a straggler: the step waits on communication"
        ),
        evidence=(
            th.evidence(
                "dist_comm_warn",
                "min_rank_collective_share",
                round(share, 4),
                "share",
                ">=",
                "stacks",
            ),
        ),
        recommendation=Recommendation(
            "Communicate less often, in bigger buckets, overlapped with compute",
            (
                f"accumulate gradients over {k} micro-batches and skip the all-reduce of all "
                "but the last (`with model.no_sync():` in DDP)",
                "DDP(bucket_cap_mb=100, gradient_as_bucket_view=True) to send fewer, larger "
                "buckets that overlap backward (default 25 MB)",
                "FSDP: backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True; "
                "sharding_strategy=ShardingStrategy.HYBRID_SHARD across nodes",
                "DeepSpeed ZeRO: overlap_comm=true, reduce_bucket_size=5e8, "
                "allgather_bucket_size=5e8, contiguous_gradients=true",
                "NCCL on PCIe-only GPUs (no NVLink in `nvidia-smi topo -m`): keep the ranks of "
                "one all-reduce on one PCIe switch; NCCL_P2P_LEVEL=PXB",
            ),
        ),
        expected_speedup=speedup,
        signals=("stacks",),
        speedup_basis=f"gradient accumulation over {k} steps: the collective share / {k}",
    )
