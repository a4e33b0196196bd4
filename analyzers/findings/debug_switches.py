"""DEBUG001: autograd's anomaly detection left on in a job that is not being debugged.

`torch.autograd.set_detect_anomaly(True)` (or Lightning's `Trainer(detect_anomaly=True)`)
makes every op of every forward record its Python stack, and every backward check each
gradient for NaN (on a GPU, a host-device sync per gradient). The hooks read the switch;
the stacks measure its stack records. The whole cost is more than the records: the backward's
checks and the records' C++ side show no Python frame, and py-spy's non-blocking sampler
undercounts fast-changing deep stacks (28% blocking, 15% non-blocking on the same job). So the
speed-up is a range, from the records alone to `RECORD_TO_WHOLE` times them.
"""

from __future__ import annotations

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.measures.switches import AnomalySeen, anomaly_seen
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Recommendation,
    speedup_from_impact,
)

DEBUG001 = register(
    Spec(
        "DEBUG001",
        "Autograd anomaly detection left on: every op records its stack",
        "host",
        True,
        note_title="Autograd anomaly detection is on; its measured cost is under the "
        "warning threshold",
        claims=("loop_time", "loop_host_time"),
        doc=Doc(
            means=(
                "autograd's anomaly detection left on (`torch.autograd.set_detect_anomaly(True)`,"
                " `detect_anomaly()`, Lightning's `Trainer(detect_anomaly=True)`): the hooks read"
                " the switch (`torch.is_anomaly_enabled()`), and the loop's stack samples in its "
                "stack records (`torch.fx.traceback.format_stack` called by torch's C++ from an "
                "op's frame, not by fx's tracer or the job's own code) are >= "
                "`anomaly_record_warn` of the loop; with the hooks' word and fewer records, a "
                "note"
            ),
            fix=(
                "turn it off for the real run (Lightning: `detect_anomaly=False`, its default); "
                "`with torch.autograd.detect_anomaly():` around one suspect step; "
                "`torch.isfinite(loss)` every 100 steps to catch NaN cheaply; `gpudiag try --fix "
                "anomaly_off` measures it"
            ),
            measured=(
                Measured(
                    impact=(
                        "the stack records' share x `RECORD_TO_WHOLE` (6), at most 90%, capped by"
                        " the GPU's idle share: the whole cost (the backward's NaN checks and the"
                        " records' C++ side show no Python frame, and non-blocking sampling "
                        "undercounts deep fast stacks) measured 2.4-6.8 times the records' "
                        "sampled share on a CPU (benchmarks/anomaly_cost.py: an MLP, Lightning's "
                        "demo Transformer, a BERT, a conv net)"
                    ),
                    speedup=(
                        "a hypothesis, unverified: from the records alone to 6 times them; "
                        "`gpudiag try` measures it (fix kind `anomaly_off`)"
                    ),
                    checked="x3.92 / x1.71-10.0 (Lightning's demo, CPU)",
                ),
            ),
        ),
    )
)


# The whole overhead of anomaly detection against the share of the loop's stack samples in its
# records, measured bare (on against off) and by `gpudiag run` on a CPU, one torch thread
# (benchmarks/anomaly_cost.py, 2026-11-26, load about 1): an MLP 2.4-3.8, Lightning's demo
# Transformer 2.4-2.8, a BERT 4.5-4.8, a conv net 3.1-6.8. The range's high end uses 6, capped
# by MAX_COST. (A cap by the forward's and backward's sampled share was tried: the same
# undercount makes it too low, x2.08 against x2.3-2.6 measured on the MLP.)
RECORD_TO_WHOLE = 6.0
MAX_COST = 0.9

ACTIONS = (
    "turn it off for the real run: delete torch.autograd.set_detect_anomaly(True) (or pass "
    "False); in Lightning, Trainer(detect_anomaly=False), its default",
    "debug with it only where a NaN appears: `with torch.autograd.detect_anomaly():` around "
    "the one suspect step, or turned on after a non-finite loss is seen",
    "to catch NaN cheaply while training: check torch.isfinite(loss) every 100 steps",
)


def _evidence(a: AnomalySeen, c: Context) -> tuple[Evidence, ...]:
    th = c.th
    crossed = a.record_share >= th.anomaly_record_warn  # else the hooks' word decides
    ev = [
        Evidence(
            "anomaly_record_share",
            round(a.record_share, 4),
            "ratio",
            th.anomaly_record_warn if crossed else None,
            ">=" if crossed else None,
            "anomaly_record_warn" if crossed else None,
            "stacks",
        ),
        Evidence("loop_stack_samples", a.samples, "count", source="stacks"),
    ]
    if a.on:
        ev.append(Evidence("anomaly_mode", 1.0, "ratio", 1.0, ">=", None, "hooks"))
        ev.append(Evidence("anomaly_check_nan", float(bool(a.check_nan)), "ratio", source="hooks"))
    if c.idle is not None:
        ev.append(Evidence("gpu_idle_share", round(c.idle, 4), "ratio", source="nvml"))
    return tuple(ev)


def _message(a: AnomalySeen, gpu: bool) -> str:
    seen = "the hooks read it on" if a.on else "seen in the stacks"
    nan = (
        ", and the backward checks every gradient for NaN"
        + (" (a host-device sync per gradient)" if gpu else "")
        if a.check_nan is not False
        else ""
    )
    return (
        f"Autograd anomaly detection is on ({seen}): every op of every forward records its "
        f"Python stack ({a.record_share:.0%} of the loop's stack samples){nan}. It is a "
        "debugging switch; a run that is not hunting a NaN pays for it every step."
    )


def _cost(a: AnomalySeen, c: Context) -> tuple[float, float]:
    """The share of the loop anomaly detection costs: (low, high). Low is its records alone,
    high RECORD_TO_WHOLE times them (at most MAX_COST); both capped by the GPU's idle share
    when there is a GPU signal (host time the GPU hides costs nothing)."""
    low = a.record_share
    high = max(low, min(MAX_COST, a.record_share * RECORD_TO_WHOLE))
    if c.idle is not None:
        low, high = min(low, c.idle), min(high, c.idle)
    return low, high


def find(c: Context) -> list[Finding]:
    """DEBUG001 from the hooks' switch and the stacks' records of anomaly detection."""
    th = c.th
    if c.profile.samples < th.stack_floor_samples:
        return []
    a = anomaly_seen(c.view, c.profile, c.clf)
    training = c.workload is not None and c.workload.kind == "training"
    if not a.on and a.record_share < th.anomaly_record_warn:
        return []
    if a.on and a.record_samples == 0 and not training:
        return []  # on, but nothing records: forwards without autograd pay nothing
    conf = confidence_above(a.record_share, th.anomaly_record_warn, a.samples)
    conf = max(0.95, conf) if a.on else conf
    if conf < th.min_confidence:
        return []
    low, high = _cost(a, c)
    return [
        new_finding(
            "DEBUG001",
            c.th,
            note=high < th.anomaly_record_warn,
            confidence=conf,
            impact=high,
            message=_message(a, bool(c.stats)),
            evidence=_evidence(a, c),
            recommendation=Recommendation("Turn autograd anomaly detection off", ACTIONS),
            expected_speedup=speedup_from_impact(high),
            signals=("hooks", "stacks") if a.on else ("stacks",),
            speedup_basis=(
                f"a hypothesis, unverified: from its stack records alone ({low:.0%} of the "
                f"loop, x{speedup_from_impact(low):.2f}) to {RECORD_TO_WHOLE:g} times them "
                f"({high:.0%}, x{speedup_from_impact(high):.2f}; the whole cost measured 2.4-6.8 "
                "times the records' share on a CPU); "
                "gpudiag try --fix anomaly_off measures it"
            ),
            speedup_kind="hypothesis",
            speedup_low=speedup_from_impact(low),
            fix={"kind": "anomaly_off", "values": {}},
        )
    ]


FINDER = Finder("debug_switches", find, (DEBUG001,))
