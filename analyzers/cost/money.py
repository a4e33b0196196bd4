"""What the waste costs: money per finding, cost per 1,000 units of
work, the price's age, and when spot capacity fits (right-sizing: analyzers.cost.projection).

Money figures exist only when the job uses a GPU and a price is known; every figure says
which price it used and where that came from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date

from gpudiag.analyzers.cost.prices import SPOT_NOTE, Price
from gpudiag.analyzers.cost.projection import unit_rate
from gpudiag.analyzers.measures.gpu_stats import GpuStats
from gpudiag.analyzers.model.catalogue import about_money, about_time_in, explains_gpu_idle
from gpudiag.analyzers.model.results import Finding
from gpudiag.analyzers.model.thresholds import Thresholds

STALE_DAYS = 365  # a reference price older than this (at the run's date) is flagged


def price_age(price: Price, run_day: date | None) -> dict:
    """The reference row's date and whether it is older than a year at the run's date."""
    if price.row is None:
        return {}
    if run_day is None:
        return {"date": price.row.date, "stale": None}
    days = (run_day - price.row.day()).days
    return {"date": price.row.date, "age_days": days, "stale": days > STALE_DAYS}


def money_rates(usd_per_hour: float) -> dict:
    return {"usd_per_hour": round(usd_per_hour, 4), "usd_per_day": round(usd_per_hour * 24, 2)}


def per_unit(section: dict, metrics: dict, workload_kind: str | None, per_hour: float) -> None:
    """Cost per 1,000 steps, requests or items (price x GPU time per unit) in `section`."""
    unit, metric, rate = unit_rate(metrics, workload_kind)
    sps, samples_ps = metrics.get("steps_per_second"), metrics.get("samples_per_second")
    section["usd_per_1000_steps"] = round(per_hour / (sps * 3.6), 4) if sps else None
    section["usd_per_million_samples"] = (
        round(per_hour / (samples_ps * 3600) * 1e6, 2) if samples_ps else None
    )
    section["unit"] = unit
    section["usd_per_1000_units"] = round(per_hour / (rate * 3.6), 4) if rate else None
    if not rate:
        section["per_unit_note"] = (
            f"cost per {unit} needs the job's rate ({metric}, from the in-process hooks); "
            "not measured in this run"
        )


@dataclass(frozen=True)
class Spend:
    """What the money is figured from: the GPUs seen, the run's metrics, the price (None: not
    known), whether the job saves checkpoints (spot fits), the right-size projection COST001
    points at (analyzers.cost.projection), the workload's kind and the day the run started
    (for the price's age)."""

    stats: list[GpuStats]
    metrics: dict
    price: Price | None
    checkpoints: bool = False
    right: dict | None = None
    workload_kind: str | None = None
    run_day: date | None = None


def cost_analysis(
    spend: Spend, findings: list[Finding], th: Thresholds
) -> tuple[dict, list[Finding]]:
    """The report's cost section, and the findings with their cost (COST001, the idle
    spend, is a finding unit of its own: analyzers/findings/idle_spend.py)."""
    price = spend.price
    used = [s for s in spend.stats if s.job_uses_gpu and s.busy is not None]
    if not used:
        return {
            "available": False,
            "reason": "no GPU used by the job: there is no GPU time to price",
        }, findings
    if price is None:
        return {
            "available": False,
            "reason": f"no price known for '{used[0].name}': give "
            "one with --price USD_PER_GPU_HOUR or [tool.gpudiag.prices]",
        }, findings
    n = len(used)
    per_hour = n * price.usd_per_gpu_hour
    idle = sum(1.0 - (s.busy or 0.0) for s in used) / n
    section: dict = {
        "available": True,
        "price": {**price.to_dict(), **price_age(price, spend.run_day)},
        "gpus": n,
        "gpu_model": used[0].name,
        **money_rates(per_hour),
        "gpu_idle_share": round(idle, 4),
        "idle": money_rates(per_hour * idle),
    }
    per_unit(section, spend.metrics, spend.workload_kind, per_hour)
    out = [
        replace(
            f,
            cost={"gpu_hours_per_hour": round(n * f.impact, 4), **money_rates(per_hour * f.impact)},
        )
        if f.impact > 0
        else f
        for f in findings
    ]
    top = [f for f in out if f.severity in ("error", "warning") and not about_money(f.id)][:3]
    if top:
        section["if_fixed"] = _if_fixed(section, top, idle, per_hour)
    if spend.checkpoints:
        section["spot"] = {
            "applicable": True,
            "note": f"the job saves checkpoints regularly, so it can resume "
            f"after preemption: {SPOT_NOTE}",
        }
    return section, out


def _if_fixed(section: dict, top: list[Finding], idle: float, per_hour: float) -> dict:
    """The money if the top finding were fixed: the same number a top finding states (one
    fix, one prediction); a modelled figure before a bound (a bound says what no fix can
    beat, not what the fix gives)."""
    first = next((f for f in top if f.speedup_kind in ("model", "floor")), top[0])
    speed = first.expected_speedup
    idle_after = max(0.0, 1.0 - (1.0 - idle) * speed) if explains_gpu_idle(first.id) else idle
    return {
        "findings": [first.id],
        "expected_speedup": round(speed, 3),
        "basis": first.speedup_basis,
        "speedup_kind": first.speedup_kind,
        "gpu_idle_share": round(idle_after, 4),
        "idle": money_rates(per_hour * idle_after),
        "usd_per_1000_steps": (
            round(section["usd_per_1000_steps"] / speed, 4)
            if section["usd_per_1000_steps"]
            else None
        ),
        "usd_per_1000_units": (
            round(section["usd_per_1000_units"] / speed, 4)
            if section["usd_per_1000_units"]
            else None
        ),
    }


def checkpoints_seen(findings: list[Finding], checkpoint_share: float) -> bool:
    """Whether the job checkpoints regularly (a checkpoint finding, or saves in the stacks)."""
    return about_time_in(findings, "checkpoint") or checkpoint_share > 0.005
