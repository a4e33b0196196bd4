"""THROT001: GPU clocks held back (thermal or hardware slowdown, the power brake, a lowered
power cap); running at the default power cap under full load is at most a note."""

from __future__ import annotations

from gpudiag.analyzers.measures.gpu_stats import GpuStats, gpu_evidence
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.model.thresholds import Thresholds

THROT001 = register(
    Spec(
        "THROT001",
        "GPU clocks throttled",
        "gpu",
        False,
        note_title="GPU at its power limit (normal under full load)",
        reads=("gpu_idle",),
        doc=Doc(
            means=(
                "clocks held back by thermal or hardware slowdown, the power brake, or a power "
                "cap set below the default (at the default cap under full load: a note)"
            ),
            fix="names the reason, its share of busy time and the clock lost",
            measured=(
                Measured(
                    impact="clock lost during busy time",
                    speedup="the clock given back",
                ),
            ),
        ),
    )
)


REASON_TEXT = {
    "power_cap": "the software power cap",
    "hw_slowdown": "hardware slowdown",
    "sw_thermal": "software thermal slowdown",
    "hw_thermal": "hardware thermal slowdown",
    "power_brake": "the power brake (external power supply signal)",
}


def throttle_findings(st: GpuStats, th: Thresholds) -> list[Finding]:
    """THROT001 when something holds the clocks back: thermal or hardware slowdown, the power
    brake, or a power cap set below the board's default. Running at the default power cap
    under full load is how the GPU is meant to run: at most a note."""
    if not st.throttle:
        return []
    reason, share = max(st.throttle.items(), key=lambda kv: kv[1])
    busy = st.busy or 0.0
    of_busy = min(1.0, share / busy) if busy > 0 else share
    if share < th.throttle_warn:
        return []
    clock_lost = None
    if st.sm_clock and st.sm_clock_max:
        clock_lost = max(0.0, 1.0 - st.sm_clock / st.sm_clock_max)
    ev = [
        gpu_evidence(
            st,
            f"throttle_{reason}",
            share,
            "ratio",
            threshold=th.throttle_warn,
            comparison=">=",
            setting="throttle_warn",
            source="nvml clock events",
        ),
        gpu_evidence(st, "throttled_share_of_busy", of_busy, "ratio", source="nvml"),
    ]
    if clock_lost is not None:
        ev.append(gpu_evidence(st, "sm_clock_below_max", clock_lost, "ratio", source="nvml clocks"))
    lowered = (
        reason == "power_cap"
        and st.power_limit is not None
        and st.power_default is not None
        and st.power_limit < th.power_cap_lowered * st.power_default
    )
    if st.power_limit is not None:
        ev.append(gpu_evidence(st, "power_limit", st.power_limit, "W", source="nvml"))
    if st.power_default is not None:
        ev.append(
            gpu_evidence(
                st,
                "power_default_limit",
                st.power_default,
                "W",
                threshold=th.power_cap_lowered,
                comparison="ratio <" if lowered else "ratio >=",
                setting="power_cap_lowered",
                source="nvml",
            )
        )
    lost_txt = f", SM clock {clock_lost:.0%} below its maximum" if clock_lost is not None else ""
    if reason == "power_cap" and not lowered:
        limit = f" ({st.power_limit:.0f} W)" if st.power_limit else ""
        msg = (
            f"GPU {st.index} ran at its power limit{limit} {share:.0%} of the time "
            f"({of_busy:.0%} of its busy time){lost_txt}. That is normal under full load: "
            "the clocks adapt to the power budget"
            + (
                ""
                if st.power_default is not None
                else "; the default limit was not recorded, so a lowered cap cannot be ruled out"
            )
            + "."
        )
        return [
            new_finding(
                "THROT001",
                th,
                note=True,
                confidence=0.9,
                impact=0.0,
                message=msg,
                evidence=tuple(ev),
                recommendation=Recommendation(
                    "Nothing to fix at the default power limit",
                    ("nvidia-smi -q -d POWER shows the enforced and default limits",),
                ),
                expected_speedup=1.0,
                signals=("nvml clock events",),
                speedup_basis="none: the board runs at its default power budget",
            )
        ]
    msg = (
        f"GPU {st.index} was held back by {REASON_TEXT.get(reason, reason)} {share:.0%} of "
        f"the time ({of_busy:.0%} of its busy time){lost_txt}"
        + (
            f"; its power limit is {st.power_limit:.0f} W, below the default "
            f"{st.power_default:.0f} W"
            if lowered
            else ""
        )
        + "."
    )
    if "thermal" in reason:
        actions = (
            "check cooling: fan speed, airflow, inlet temperature, dust",
            "nvidia-smi -q -d TEMPERATURE,PERFORMANCE shows the slowdown thresholds",
        )
    else:
        actions = (
            "nvidia-smi -q -d POWER: compare the enforced limit with the default; "
            f"restore it with nvidia-smi -pl {st.power_default or 0:.0f}"
            if lowered
            else "nvidia-smi -q -d POWER: check the enforced limit",
            "check the PSU and power cabling when the power brake engages",
        )
    impact = min(0.99, of_busy * (clock_lost if clock_lost is not None else 0.2) * busy)
    return [
        new_finding(
            "THROT001",
            th,
            detail=f"by {REASON_TEXT.get(reason, reason)}",
            confidence=0.9,
            impact=impact,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation("Remove the cause of the slowdown", actions),
            expected_speedup=speedup_from_impact(impact),
            signals=("nvml clock events",),
            speedup_basis="the lost clock share given back during busy time",
        )
    ]
