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

from gpudiag.analyzers.distributed.findings import Straggler, dist001, dist003
from gpudiag.analyzers.distributed.ranks import (
    CAUSES,
    RANK_PARTS,
    RankStats,
    hook_wait,
    rank_parts,
    uses_ddp,
    wait_share,
)
from gpudiag.analyzers.model.results import Finding
from gpudiag.analyzers.model.thresholds import Thresholds

__all__ = [
    "CAUSES",
    "RANK_PARTS",
    "RankStats",
    "adjusted_parts",
    "rank_parts",
    "straggler",
    "uses_ddp",
]


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
    culprit = min(known, key=wait_share)
    victims = [r for r in known if r is not culprit]
    gaps = [wait_share(v) - wait_share(culprit) for v in victims]
    lost = sum(gaps) / len(gaps)
    hidden = _hidden_wait(known, th)
    if min(gaps) >= th.dist_straggler_gap and (hidden is None or hidden[1] <= lost):
        return [dist001(Straggler(culprit, victims, lost), th)], {
            "decided": True,
            "straggler": culprit.rank,
        }
    if hidden is not None:  # a larger wait hidden under backward (DDP) than in collectives
        culprit, lost = hidden
        victims = [r for r in known if r is not culprit]
        return [dist001(Straggler(culprit, victims, lost, hidden=True), th)], {
            "decided": True,
            "straggler": culprit.rank,
            "basis": "the others' wait hidden under backward (DDP): inferred from shares",
        }
    times = [r.step_time_s for r in known if r.step_time_s]
    out: list[Finding] = []
    if min(wait_share(r) for r in known) >= th.dist_comm_warn:
        out.append(dist003(known, th))
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


def adjusted_parts(r: RankStats) -> dict[str, float]:
    """The rank's parts with its measured wait moved out of compute: DDP's all-reduce runs
    under backward, so the stacks count that wait as compute (backward)."""
    parts = dict(r.parts)
    hidden = max(0.0, hook_wait(r) - parts.get("collectives", 0.0))
    moved = min(hidden, parts.get("compute", 0.0))
    parts["compute"] = parts.get("compute", 0.0) - moved
    parts["collectives"] = parts.get("collectives", 0.0) + moved
    return parts


def _straggler_measured(ranks: list[RankStats], th: Thresholds) -> tuple[list[Finding], dict]:
    """DIST001/DIST003 from the waits the hooks timed: the rank that waits least while the
    others wait for it is the culprit; its cause from the stacks when they suffice."""
    culprit = min(ranks, key=hook_wait)
    victims = [r for r in ranks if r is not culprit]
    gaps = [hook_wait(v) - hook_wait(culprit) for v in victims]
    lost = sum(gaps) / len(gaps)
    waits = ", ".join(f"rank {r.rank} {hook_wait(r):.0%}" for r in ranks)
    basis = f"measured by the collective hooks (share of the step in collectives: {waits})"
    if min(gaps) >= th.dist_straggler_gap:
        enough = all(r.samples >= th.dist_min_rank_samples for r in ranks)
        parts = {r.rank: adjusted_parts(r) for r in ranks} if enough else None
        f = dist001(Straggler(culprit, victims, lost, wait=hook_wait, parts=parts), th)
        return [f], {"decided": True, "straggler": culprit.rank, "basis": basis}
    if max(gaps) >= th.dist_straggler_gap:
        return [], {
            "decided": False,
            "reason": f"some ranks wait for rank {culprit.rank} and some keep pace with it "
            f"({basis}): no single straggler",
        }
    out = [dist003(ranks, th, hook_wait)] if min(map(hook_wait, ranks)) >= th.dist_comm_warn else []
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
