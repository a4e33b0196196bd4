"""DEBUG001: a debugging switch left on in torch's settings, in a job that is not being
debugged: one finding over the table of settings the hooks read (measures/switches.py's
SETTINGS): autograd's anomaly detection, deterministic algorithms, cuDNN's deterministic mode.
Anomaly detection's cost is measured from the stacks (below); the others' cost is in torch's
kernels, where no stack shows it: named, with what they cost and how to change them, and
measured by `gpudiag try --fix settings:...` (a note until then).

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
from gpudiag.analyzers.measures.switches import (
    AnomalySeen,
    Setting,
    anomaly_seen,
    debugging_on,
)
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
        "A debugging switch left on in torch's settings",
        "host",
        True,
        note_title="A debugging switch is on in torch's settings; its cost is under the "
        "warning threshold or not measured",
        claims=("loop_time", "loop_host_time"),
        doc=Doc(
            means=(
                "a debugging switch left on in torch's settings, read by the hooks from torch's "
                "own state at start and every 2 s (one table, [below](#torchs-settings-one-"
                "table)): autograd's anomaly detection left on "
                "(`torch.autograd.set_detect_anomaly(True)`,"
                " `detect_anomaly()`, Lightning's `Trainer(detect_anomaly=True)`): the hooks read"
                " the switch (`torch.is_anomaly_enabled()`), and the loop's stack samples in its "
                "stack records (`torch.fx.traceback.format_stack` called by torch's C++ from an "
                "op's frame, not by fx's tracer or the job's own code) are >= "
                "`anomaly_record_warn` of the loop; with the hooks' word and fewer records, a "
                "note; deterministic algorithms (`torch.use_deterministic_algorithms(True)`) and,"
                " on a GPU, `torch.backends.cudnn.deterministic`: named in the same finding (one "
                "cause, one id), a note on their own (their cost is in torch's kernels, where no "
                "stack shows it)"
            ),
            fix=(
                "turn it off for the real run (Lightning: `detect_anomaly=False`, its default); "
                "`with torch.autograd.detect_anomaly():` around one suspect step; "
                "`torch.isfinite(loss)` every 100 steps to catch NaN cheaply; "
                "`torch.use_deterministic_algorithms(False)` outside a run that must be "
                "reproducible; `gpudiag try --fix anomaly_off` (anomaly detection alone) or "
                "`--fix settings:anomaly=false,deterministic=false,...` measures it"
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


SETTINGS_FIELD = {
    "anomaly_mode": "anomaly",
    "deterministic_algorithms": "deterministic",
    "cudnn_deterministic": "cudnn_deterministic",
}


def _others_lines(others: tuple[Setting, ...]) -> str:
    return "; ".join(f"{s.reads} is {s.slow}: {s.costs}" for s in others)


def _settings_fix(others: tuple[Setting, ...], anomaly: bool) -> dict:
    """The trial that turns the switches off (anomaly detection alone: its own kind)."""
    if not others:
        return {"kind": "anomaly_off", "values": {}}
    fields = (("anomaly_mode",) if anomaly else ()) + tuple(s.field for s in others)
    return {"kind": "settings", "values": {SETTINGS_FIELD[f]: False for f in fields}}


def _others_only(others: tuple[Setting, ...], c: Context) -> Finding:
    """DEBUG001 for switches whose cost no stack shows: a note, named with what they cost
    and how to change them, and the trial that measures it."""
    fix = _settings_fix(others, False)
    spec = ",".join(f"{k}=false" for k in fix["values"])
    return new_finding(
        "DEBUG001",
        c.th,
        note=True,
        detail=f"({', '.join(s.reads for s in others)})",
        confidence=0.95,
        impact=0.0,
        message=(
            f"The hooks read a debugging switch on: {_others_lines(others)}. Its cost is in "
            "torch's kernels, where no stack sample shows it: a run that does not need "
            "bit-for-bit reproducibility pays it every step."
        ),
        evidence=tuple(Evidence(s.field, 1.0, "ratio", 1.0, ">=", None, "hooks") for s in others),
        recommendation=Recommendation(
            "Turn the debugging switch off for the real run",
            tuple(s.change for s in others)
            + (f"measure it first: gpudiag try --fix settings:{spec} -- <the job>",),
        ),
        expected_speedup=1.0,
        signals=("hooks",),
        speedup_basis=(
            "not measured: its cost is in torch's kernels, not in the stacks; "
            f"gpudiag try --fix settings:{spec} measures it"
        ),
        speedup_kind="hypothesis",
        speedup_low=1.0,
        fix=fix,
    )


def find(c: Context) -> list[Finding]:
    """DEBUG001 from the hooks' settings table and the stacks' records of anomaly
    detection."""
    th = c.th
    if c.profile.samples < th.stack_floor_samples:
        return []
    others = debugging_on(c.view, bool(c.stats))
    a = anomaly_seen(c.view, c.profile, c.clf)
    training = c.workload is not None and c.workload.kind == "training"
    if not a.on and a.record_share < th.anomaly_record_warn:
        return [_others_only(others, c)] if others else []
    if a.on and a.record_samples == 0 and not training:
        # on, but nothing records: forwards without autograd pay nothing
        return [_others_only(others, c)] if others else []
    conf = confidence_above(a.record_share, th.anomaly_record_warn, a.samples)
    conf = max(0.95, conf) if a.on else conf
    if conf < th.min_confidence:
        return [_others_only(others, c)] if others else []
    low, high = _cost(a, c)
    also = f" Also on: {_others_lines(others)}." if others else ""
    return [
        new_finding(
            "DEBUG001",
            c.th,
            note=high < th.anomaly_record_warn,
            confidence=conf,
            impact=high,
            detail="(autograd anomaly detection: every op records its stack)",
            message=_message(a, bool(c.stats)) + also,
            evidence=_evidence(a, c),
            recommendation=Recommendation(
                "Turn autograd anomaly detection off", ACTIONS + tuple(s.change for s in others)
            ),
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
            fix=_settings_fix(others, True),
        )
    ]


FINDER = Finder("debug_switches", find, (DEBUG001,))
