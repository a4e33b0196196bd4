"""What the waste costs: money per finding, idle spend (COST001), cost per unit of work,
right-sizing from the measured peak VRAM and compute share, and when spot capacity fits.

Money figures exist only when the job uses a GPU and a price is known; every figure says
which price it used and where that came from.
"""

from __future__ import annotations

from dataclasses import replace

from gpudiag.analyzers.cost.prices import AS_OF, MODELS, SPOT_NOTE, Price, by_key, identify
from gpudiag.analyzers.engine.catalogue import (
    about_time_in,
    explains_gpu_idle,
    new_finding,
)
from gpudiag.analyzers.engine.results import Evidence, Finding, Recommendation
from gpudiag.analyzers.engine.thresholds import Thresholds
from gpudiag.analyzers.measures.gpu_stats import GIB, GpuStats

VRAM_MARGIN = 1.25  # right-sizing keeps 25% above the measured peak
SPEED_MARGIN = 1.2  # and 20% above the compute the job actually used


def resolve_price(
    stats: list[GpuStats], override: Price | None, table: dict[str, float]
) -> Price | None:
    """The price to use: an explicit one, the user's table, else the built-in reference."""
    if override is not None:
        return override
    if not stats:
        return None
    model = identify(stats[0].name)
    for key in ([model.key] if model else []) + [stats[0].name, "default"]:
        for name, usd in table.items():
            if name.lower() == key.lower():
                return Price(
                    float(usd), f"user price table entry '{name}'", model.key if model else None
                )
    if model is None:
        return None
    return Price(
        model.on_demand_usd,
        f"built-in reference: {model.label} on-demand, {AS_OF} ({model.basis})",
        model.key,
    )


def _money(usd_per_hour: float) -> dict:
    return {"usd_per_hour": round(usd_per_hour, 4), "usd_per_day": round(usd_per_hour * 24, 2)}


def right_size(stats: list[GpuStats], price: Price) -> dict | None:
    """The cheapest reference GPU that holds peak VRAM +25% and the compute the job used."""
    st = max(stats, key=lambda s: s.mem_peak or 0.0)
    current = by_key(price.model) if price.model else identify(st.name)
    if st.mem_peak is None or current is None:
        return None
    busy = st.sm_active if st.sm_active is not None else (st.busy or 0.0)
    need_gib = st.mem_peak / GIB * VRAM_MARGIN
    need_speed = current.relative_speed * busy * SPEED_MARGIN
    fits = [
        m
        for m in MODELS
        if m.memory_gib >= need_gib
        and m.relative_speed >= need_speed
        and m.on_demand_usd < current.on_demand_usd
        and m.key != current.key
    ]
    base = {
        "peak_vram_gib": round(st.mem_peak / GIB, 2),
        "need_vram_gib": round(need_gib, 2),
        "compute_share": round(busy, 4),
        "current": current.label,
        "basis": "measured peak VRAM (+25%) and busy share (+20%) against the reference "
        "table's memory and relative speed classes; an estimate, not a promise",
    }
    if not fits:
        return {
            **base,
            "suggestion": None,
            "statement": f"no cheaper reference GPU holds {need_gib:.1f} GiB with the "
            "compute this job used",
        }
    best = min(fits, key=lambda m: m.on_demand_usd)
    ratio = best.on_demand_usd / current.on_demand_usd
    return {
        **base,
        "suggestion": best.label,
        "suggestion_usd_per_gpu_hour": best.on_demand_usd,
        "price_ratio": round(ratio, 3),
        "statement": f"this job peaks at {st.mem_peak / GIB:.1f} GiB and keeps its "
        f"{current.label} busy {busy:.0%} of the time; "
        f"{'an' if best.label[0] in 'AEFHILMNORSX8' else 'a'} {best.label} would "
        f"hold it with room, at about {ratio:.0%} of the hourly price "
        "(estimate)",
    }


def cost_analysis(
    stats: list[GpuStats],
    findings: list[Finding],
    metrics: dict,
    checkpoints: bool,
    price: Price | None,
    th: Thresholds,
) -> tuple[dict, list[Finding]]:
    """The report's cost section, and the findings with their cost (plus COST001)."""
    used = [s for s in stats if s.job_uses_gpu and s.busy is not None]
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
        "price": price.to_dict(),
        "gpus": n,
        "gpu_model": used[0].name,
        **_money(per_hour),
        "gpu_idle_share": round(idle, 4),
        "idle": _money(per_hour * idle),
    }
    sps, samples_ps = metrics.get("steps_per_second"), metrics.get("samples_per_second")
    section["usd_per_1000_steps"] = round(per_hour / (sps * 3.6), 4) if sps else None
    section["usd_per_million_samples"] = (
        round(per_hour / (samples_ps * 3600) * 1e6, 2) if samples_ps else None
    )
    if not sps:
        section["per_unit_note"] = (
            "cost per step needs the job's step rate (in-process step "
            "timing); not measured in this run"
        )
    out = [
        replace(
            f, cost={"gpu_hours_per_hour": round(n * f.impact, 4), **_money(per_hour * f.impact)}
        )
        if f.impact > 0
        else f
        for f in findings
    ]
    top = [f for f in out if f.severity in ("error", "warning")][:3]
    if top:
        # the same number a top finding states: one fix, one prediction; a modelled figure
        # before a bound (a bound says what no fix can beat, not what the fix gives)
        first = next((f for f in top if f.speedup_kind == "model"), top[0])
        speed = first.expected_speedup
        idle_after = max(0.0, 1.0 - (1.0 - idle) * speed) if explains_gpu_idle(first.id) else idle
        section["if_fixed"] = {
            "findings": [first.id],
            "expected_speedup": round(speed, 3),
            "basis": first.speedup_basis,
            "speedup_kind": first.speedup_kind,
            "gpu_idle_share": round(idle_after, 4),
            "idle": _money(per_hour * idle_after),
            "usd_per_1000_steps": (
                round(section["usd_per_1000_steps"] / speed, 4)
                if section["usd_per_1000_steps"]
                else None
            ),
        }
    sizing = right_size(used, price)
    if sizing:
        section["right_sizing"] = sizing
    if checkpoints:
        section["spot"] = {
            "applicable": True,
            "note": f"the job saves checkpoints regularly, so it can resume "
            f"after preemption: {SPOT_NOTE}",
        }
    if idle >= th.cost_idle_warn:
        out.append(_cost001(used, idle, per_hour, price, top, sizing, checkpoints, th))
    return section, out


def _cost001(
    used: list[GpuStats],
    idle: float,
    per_hour: float,
    price: Price,
    top: list[Finding],
    sizing: dict | None,
    checkpoints: bool,
    th: Thresholds,
) -> Finding:
    day = per_hour * 24
    ev = (
        Evidence(
            "gpu_idle_share",
            round(idle, 4),
            "ratio",
            th.cost_idle_warn,
            ">=",
            "cost_idle_warn",
            "nvml utilization",
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
    if sizing and sizing.get("suggestion"):
        actions.append(f"right-size: {sizing['statement']}")
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
        cost=_money(per_hour * idle),
        signals=("nvml utilization", "price"),
        speedup_basis="none: the money view of the causes above (their speed-ups are theirs)",
    )


def checkpoints_seen(findings: list[Finding], checkpoint_share: float) -> bool:
    """Whether the job checkpoints regularly (a checkpoint finding, or saves in the stacks)."""
    return about_time_in(findings, "checkpoint") or checkpoint_share > 0.005
