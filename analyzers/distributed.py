"""Distributed jobs: per-rank breakdowns compared, the straggler told from its victims, a hang
explained, communication-bound steps. Pure functions over per-rank summaries.

Where a rank waits decides, not its step time: in a data-parallel job every rank's step takes
as long as the slowest one's, because the others wait for it inside the collective. So the
victims show a large share of their step inside collectives and the culprit a small one;
the culprit's own cause is the share it spends where the others do not (its DataLoader, its
compute). With DDP the all-reduce runs in C++ under `backward`, and the stacks cannot see the
wait; the in-process hooks time it (a DDP communication hook), and when every rank has enough
timed steps those measured waits decide, with the wait moved out of the victims' backward
before the culprit's own cause is named. Without them the wait is inferred from the shares, or
the analysis says the signal is missing instead of guessing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpudiag.analyzers.catalogue import new_finding
from gpudiag.analyzers.dist_gpu import gpu_cause
from gpudiag.analyzers.results import (
    Breakdown,
    Evidence,
    Finding,
    Location,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.thresholds import Thresholds

# the per-rank breakdown's parts, from the Breakdown categories
RANK_PARTS: dict[str, tuple[str, ...]] = {
    "data": ("data_wait", "storage_io"),
    "compute": ("forward", "backward", "optimizer", "sync"),
    "copies": ("h2d_copy",),
    "collectives": ("collective",),
    "checkpoint": ("checkpoint",),
    "other": ("gil_wait", "other"),
}
CAUSES = {
    "data": "its input pipeline (DataLoader) is slower",
    "compute": "its own compute is slower (a throttled GPU, a GPU shared with another "
    "process, or more work on this rank)",
    "copies": "its host-to-device copies are slower",
    "checkpoint": "it saves checkpoints the others do not wait for",
    "other": "its own loop work outside forward, backward and the optimizer (Python in the "
    "loop, a transform done on the loop thread, GIL contention)",
}


@dataclass(frozen=True)
class RankStats:
    """One rank's summary: who it is and where its loop's time goes."""

    rank: int
    pid: int | None = None
    host: str | None = None
    gpu: str | None = None
    parts: dict[str, float] = field(default_factory=dict)  # RANK_PARTS shares of its loop
    samples: int = 0  # stack samples behind `parts`
    steps: int | None = None
    step_time_s: float | None = None  # mean, from the hooks
    collective_share_hooks: float | None = None  # time inside collectives / step time (hooks)
    location: str | None = None  # its hottest user frame (file:line:function)
    locations: dict[str, str] = field(default_factory=dict)  # part -> its hottest user frame
    detail: dict[str, float] = field(default_factory=dict)  # Breakdown shares (forward, ...)
    gpu_stats: dict[str, float] = field(default_factory=dict)  # its GPU's means (NVML)
    ddp: bool = False  # its stacks pass through DistributedDataParallel (waits under backward)


DDP_FILE = "torch/nn/parallel/distributed.py"


def uses_ddp(stacks_by_category: dict) -> bool:
    """Whether a rank's loop stacks pass through DistributedDataParallel's forward."""
    return any(
        DDP_FILE in s.stack.replace("\\", "/")
        for group in stacks_by_category.values()
        for s in group
    )


def rank_parts(bd: Breakdown) -> dict[str, float]:
    """A Breakdown folded into the per-rank parts: data, compute, copies, collectives,
    checkpoint, other."""
    return {
        part: round(sum(bd.shares.get(c, 0.0) for c in cats), 6)
        for part, cats in RANK_PARTS.items()
    }


def _wait(r: RankStats) -> float:
    """Share of the rank's step inside collectives: the stacks, else the hooks."""
    if r.samples:
        return r.parts.get("collectives", 0.0)
    return r.collective_share_hooks or 0.0


def straggler(ranks: list[RankStats], th: Thresholds) -> tuple[list[Finding], dict]:
    """DIST001 when one rank's victims wait for it; else DIST003 when every rank waits in
    collectives; plus the decision in words (`decided`, `reason`) for the report."""
    known = [r for r in ranks if r.samples >= th.dist_min_rank_samples]
    if len(ranks) < 2:
        return [], {"decided": False, "reason": "one rank seen: nothing to compare"}
    if measured(ranks, th):
        return _straggler_measured(ranks, th)
    if len(known) < 2:
        return [], {
            "decided": False,
            "reason": f"fewer than two ranks have {th.dist_min_rank_samples} stack samples "
            "of their loop (setting dist_min_rank_samples): where each rank waits is unknown",
        }
    culprit = min(known, key=_wait)
    victims = [r for r in known if r is not culprit]
    gaps = [_wait(v) - _wait(culprit) for v in victims]
    lost = sum(gaps) / len(gaps)
    hidden = _hidden_wait(known, th)
    if min(gaps) >= th.dist_straggler_gap and (hidden is None or hidden[1] <= lost):
        return [_dist001(culprit, victims, lost, th)], {
            "decided": True,
            "straggler": culprit.rank,
        }
    if hidden is not None:  # a larger wait hidden under backward (DDP) than in collectives
        culprit, lost = hidden
        victims = [r for r in known if r is not culprit]
        return [_dist001(culprit, victims, lost, th, hidden=True)], {
            "decided": True,
            "straggler": culprit.rank,
            "basis": "the others' wait hidden under backward (DDP): inferred from shares",
        }
    times = [r.step_time_s for r in known if r.step_time_s]
    out: list[Finding] = []
    if min(_wait(r) for r in known) >= th.dist_comm_warn:
        out.append(_dist003(known, th))
    spread = [r.parts.get("compute", 0.0) for r in known]
    if max(spread) - min(spread) >= th.dist_straggler_gap:
        return out, {
            "decided": False,
            "reason": "the ranks wait about as long in collectives, yet their compute shares "
            "differ: with DDP the all-reduce wait is hidden under backward (C++), so a rank "
            "slow in its own backward cannot be told from its victims by the stacks; "
            "compare the ranks' GPUs (throttling, other processes)",
        }
    if any(r.ddp for r in known):
        return out, {
            "decided": False,
            "reason": "the ranks' stacks look alike, but with DDP the gradient all-reduce waits "
            "under backward (C++), where the stacks cannot see it: a rank slow in its own "
            "backward and a balanced job look the same here; `gpudiag run -- torchrun ...` "
            "(or instrument() in the script) times that wait with a DDP communication hook",
        }
    reason = "every rank waits about as long in collectives: no straggler"
    if times and max(times) > 0:
        reason += f" (step time {min(times) * 1e3:.0f}-{max(times) * 1e3:.0f} ms)"
    return out, {"decided": True, "straggler": None, "reason": reason}


def measured(ranks: list[RankStats], th: Thresholds) -> bool:
    """Whether every rank's wait in collectives was timed by the hooks over enough steps."""
    return all(
        r.collective_share_hooks is not None and (r.steps or 0) >= th.dist_min_rank_steps
        for r in ranks
    )


def _hook_wait(r: RankStats) -> float:
    return r.collective_share_hooks or 0.0


def adjusted_parts(r: RankStats) -> dict[str, float]:
    """The rank's parts with its measured wait moved out of compute: DDP's all-reduce runs
    under backward, so the stacks count that wait as compute (backward)."""
    parts = dict(r.parts)
    hidden = max(0.0, _hook_wait(r) - parts.get("collectives", 0.0))
    moved = min(hidden, parts.get("compute", 0.0))
    parts["compute"] = parts.get("compute", 0.0) - moved
    parts["collectives"] = parts.get("collectives", 0.0) + moved
    return parts


def _straggler_measured(ranks: list[RankStats], th: Thresholds) -> tuple[list[Finding], dict]:
    """DIST001/DIST003 from the waits the hooks timed: the rank that waits least while the
    others wait for it is the culprit; its cause from the stacks when they suffice."""
    culprit = min(ranks, key=_hook_wait)
    victims = [r for r in ranks if r is not culprit]
    gaps = [_hook_wait(v) - _hook_wait(culprit) for v in victims]
    lost = sum(gaps) / len(gaps)
    waits = ", ".join(f"rank {r.rank} {_hook_wait(r):.0%}" for r in ranks)
    basis = f"measured by the collective hooks (share of the step in collectives: {waits})"
    if min(gaps) >= th.dist_straggler_gap:
        enough = all(r.samples >= th.dist_min_rank_samples for r in ranks)
        parts = {r.rank: adjusted_parts(r) for r in ranks} if enough else None
        f = _dist001(culprit, victims, lost, th, wait=_hook_wait, parts=parts)
        return [f], {"decided": True, "straggler": culprit.rank, "basis": basis}
    if max(gaps) >= th.dist_straggler_gap:
        return [], {
            "decided": False,
            "reason": f"some ranks wait for rank {culprit.rank} and some keep pace with it "
            f"({basis}): no single straggler",
        }
    out = (
        [_dist003(ranks, th, _hook_wait)]
        if min(map(_hook_wait, ranks)) >= th.dist_comm_warn
        else []
    )
    return out, {
        "decided": True,
        "straggler": None,
        "reason": f"every rank waits about as long in collectives: no straggler ({basis})",
    }


def _hidden_wait(ranks: list[RankStats], th: Thresholds) -> tuple[RankStats, float] | None:
    """DDP: the victims' wait is inside their backward. A rank that spends a share of its
    step outside compute (its data, copies, checkpoint, or its own loop work when the stacks
    place that in the user's code) that the others spend in compute instead is the straggler;
    the others' extra compute share is what they lose."""
    best: tuple[RankStats, float] | None = None
    for c in ranks:
        others = [r for r in ranks if r is not c]
        deficit = min(r.parts.get("compute", 0.0) for r in others) - c.parts.get("compute", 0.0)
        own = ("data", "copies", "checkpoint") + (("other",) if c.locations.get("other") else ())
        excess = max(c.parts.get(p, 0.0) - max(r.parts.get(p, 0.0) for r in others) for p in own)
        lost = min(deficit, excess)
        if lost >= th.dist_straggler_gap and (best is None or lost > best[1]):
            best = (c, lost)
    return best


def _label(r: RankStats) -> str:
    where = f" on {r.host}" if r.host else ""
    gpu = f", GPU {r.gpu}" if r.gpu is not None else ""
    return f"rank {r.rank}{where}{gpu}"


def _dist001(
    culprit: RankStats,
    victims: list[RankStats],
    lost: float,
    th: Thresholds,
    hidden: bool = False,
    wait=None,
    parts: dict[int, dict[str, float]] | None = None,
) -> Finding:
    """DIST001 for `culprit`; `wait` gives a rank's share in collectives (the stacks' by
    default, the hooks' when measured) and `parts` the parts its cause is read from (None:
    too few stack samples to name it)."""
    wait = wait or _wait
    got = parts or {r.rank: r.parts for r in [culprit, *victims]}
    mean = {
        p: sum(got[v.rank].get(p, 0.0) for v in victims) / len(victims)
        for p in RANK_PARTS
        if p != "collectives"
    }
    excess = {
        p: got[culprit.rank].get(p, 0.0) - m
        for p, m in mean.items()
        if not (hidden and p == "compute")
    }
    own, extra = max(excess.items(), key=lambda kv: kv[1])
    cause = CAUSES[own] if extra > 0 else "its own cause is not visible in its stacks"
    if wait is not _wait and parts is None:
        cause = f"not named: fewer than {th.dist_min_rank_samples} stack samples of a rank's loop"
    no_stacks = wait is not _wait and parts is None
    by_gpu = (
        gpu_cause(culprit.gpu, culprit.gpu_stats, th) if own == "compute" or no_stacks else None
    )
    if by_gpu is not None:
        cause, own = by_gpu[0], "compute"
    names = ", ".join(str(v.rank) for v in victims)
    step = culprit.step_time_s
    per_step = f" ({lost * step * 1e3:.0f} ms of every {step * 1e3:.0f} ms step)" if step else ""
    if wait is not _wait:
        under = any(v.parts.get("compute", 0.0) > got[v.rank].get("compute", 0.0) for v in victims)
        where = (
            f"rank(s) {names} wait for it inside collectives {lost:.0%} of their step more "
            f"than it does{per_step}, measured by gpudiag's collective hooks"
            + (" (DDP's all-reduce, hidden under their backward)" if under else "")
            + f"; it waits only {wait(culprit):.0%} of its step"
        )
    elif hidden:
        where = (
            f"rank(s) {names} wait for it: their compute share is {lost:.0%} of the step "
            f"larger than its own{per_step}, the wait DDP's all-reduce hides under backward "
            "(inferred: no stack shows the collective)"
        )
    else:
        where = (
            f"rank(s) {names} wait for it inside collectives {lost:.0%} of their step more "
            f"than it does{per_step}; it waits in collectives only {_wait(culprit):.0%} of "
            "its step"
        )
    share = got[culprit.rank].get(own, 0.0)
    msg = f"{_label(culprit)} is the straggler: {where}. Its own cause: {cause}"
    if parts is not None or wait is _wait:
        msg += f" ({own} {share:.0%} of its step vs {mean[own]:.0%} on the others)"
        loc = culprit.locations.get(own) or culprit.location
        msg += f", at {loc}" if loc else ""
    msg += f". If it kept pace, every rank would step {speedup_from_impact(lost):.2f}x faster."
    actions = {
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
    speedup = speedup_from_impact(lost)
    # how likely the smallest gap is above the threshold, from the stack samples behind it
    v = min(victims, key=wait)
    p1, p2 = wait(v), wait(culprit)
    n1, n2 = (
        (v.steps or 1, culprit.steps or 1) if wait is not _wait else (v.samples, culprit.samples)
    )
    se = math.sqrt(p1 * (1 - p1) / max(1, n1) + p2 * (1 - p2) / max(1, n2))
    if hidden:
        p1, p2 = lost, 0.0
    z = (p1 - p2 - th.dist_straggler_gap) / max(se, 1e-6)
    confidence = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    return new_finding(
        "DIST001",
        th,
        confidence=confidence,
        impact=min(1.0, lost),
        message=msg,
        evidence=(
            Evidence(
                "rank_collective_wait_gap",
                round(lost, 4),
                "share",
                th.dist_straggler_gap,
                ">=",
                "dist_straggler_gap",
                "stacks" if wait is _wait else "hooks",
            ),
            Evidence(f"rank{culprit.rank}_{own}_share", share, "share"),
            Evidence(f"rank{culprit.rank}_collective_share", wait(culprit), "share"),
            *((by_gpu[1],) if by_gpu else ()),
        ),
        recommendation=Recommendation(f"Make rank {culprit.rank} keep pace", actions),
        expected_speedup=speedup,
        location=_loc(culprit.locations.get(own) or culprit.location),
        signals=("stacks", "hooks") if culprit.step_time_s else ("stacks",),
        speedup_basis="the others' extra wait in collectives removed: every rank steps at "
        "the pace of the victims' work",
    )


def _loc(text: str | None) -> Location | None:
    if not text:
        return None
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return Location(parts[0], int(parts[1]), parts[2])


def _dist003(ranks: list[RankStats], th: Thresholds, wait=None) -> Finding:
    wait = wait or _wait
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
            Evidence(
                "min_rank_collective_share",
                round(share, 4),
                "share",
                th.dist_comm_warn,
                ">=",
                "dist_comm_warn",
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
