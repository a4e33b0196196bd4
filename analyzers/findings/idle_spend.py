"""COST001: money spent on GPU time the job leaves idle: the money view of the causes found
before it (their speed-ups are theirs), named once the idle share of the spend crosses
`cost_idle_warn`."""

from __future__ import annotations

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.cost.money import Spend, checkpoints_seen, money_rates
from gpudiag.analyzers.cost.prices import SPOT_NOTE, Price
from gpudiag.analyzers.cost.projection import right_size_line
from gpudiag.analyzers.measures.gpu_stats import GpuStats
from gpudiag.analyzers.model.catalogue import (
    Doc,
    Spec,
    about_money,
    new_finding,
    ranked,
    register,
)
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds

COST001 = register(
    Spec(
        "COST001",
        "Money spent on GPU time the job leaves idle",
        "cost",
        False,
        None,
        reads=("*",),
        about_money=True,
        doc=Doc(
            means="more than 30% of the GPU spend is idle",
            fix=(
                "the daily figure at the price shown; fix the top finding, right-size, spot when "
                "the job checkpoints"
            ),
        ),
    )
)


def find(c: Context) -> list[Finding]:
    """COST001 when the job's GPUs idle `cost_idle_warn` or more of the time and a price is
    known, with the top three causes found before it as what to fix first."""
    used = [s for s in c.stats if s.job_uses_gpu and s.busy is not None]
    if not used or c.price is None:
        return []
    idle = sum(1.0 - (s.busy or 0.0) for s in used) / len(used)
    if idle < c.th.cost_idle_warn:
        return []
    found = ranked(list(c.found))
    top = [f for f in found if f.severity in ("error", "warning") and not about_money(f.id)][:3]
    spend = Spend(
        list(c.stats),
        c.metrics,
        c.price,
        checkpoints_seen(found, c.profile.share("checkpoint")),
        right=c.right_size,
    )
    return [idle_spend(spend, used, idle, c.price, top, c.th)]


def idle_spend(
    spend: Spend,
    used: list[GpuStats],
    idle: float,
    price: Price,
    top: list[Finding],
    th: Thresholds,
) -> Finding:
    per_hour = len(used) * price.usd_per_gpu_hour
    sizing = right_size_line(spend.right)
    checkpoints = spend.checkpoints
    day = per_hour * 24
    ev = (
        th.evidence(
            "cost_idle_warn", "gpu_idle_share", round(idle, 4), "ratio", ">=", "nvml utilization"
        ),
        Evidence("price", price.usd_per_gpu_hour, "USD/GPU-hour", source=price.source),
        Evidence("gpu_spend", round(day, 2), "USD/day", source="price x GPUs"),
        Evidence("idle_spend", round(day * idle, 2), "USD/day", source="price x idle share"),
    )
    msg = (
        f"{idle:.0%} of the GPU spend is idle: about ${day * idle:,.0f} of ${day:,.0f} per "
        f"day on {len(used)}x {used[0].name} at ${price.usd_per_gpu_hour:.2f}/GPU-hour "
        f"({price.source})."
    )
    actions = []
    if top:
        actions.append("fix the findings above first: " + ", ".join(f.id for f in top))
    if sizing:
        actions.append(f"right-size: {sizing}")
    if checkpoints:
        actions.append(f"use spot/preemptible capacity: {SPOT_NOTE}")
    actions.append("profile before you provision: rerun gpudiag after each change")
    # COST001 is the money view of the causes above, not another cause of lost wall time:
    # its impact is 0 so that it ranks after them; its size is in `cost`.
    return new_finding(
        "COST001",
        th,
        confidence=0.8,
        impact=0.0,
        message=msg,
        evidence=ev,
        recommendation=Recommendation(
            f"About ${day * idle:,.0f}/day of GPU time is idle", tuple(actions)
        ),
        expected_speedup=1.0,
        cost=money_rates(per_hour * idle),
        signals=("nvml utilization", "price"),
        speedup_basis="none: the money view of the causes above (their speed-ups are theirs)",
    )


FINDER = Finder("idle_spend", find, (COST001,))
