"""GIL001: other Python threads of the job hold the GIL while the training loop waits for it."""

from __future__ import annotations

from dataclasses import replace

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.measures.loop import GilStats, LoopProfile, location_of
from gpudiag.analyzers.measures.serving import handler_names
from gpudiag.analyzers.measures.summary import SAMPLE_CORRELATION, confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.model.thresholds import Thresholds

GIL001 = register(
    Spec(
        "GIL001",
        "Python threads contend for the GIL and starve the loop",
        "host",
        True,
        time_in="gil_wait",
        claims=("loop_time",),
        own_check="GIL",  # schedstat and --gil ticks, not the loop's stacks
        doc=Doc(
            means=(
                "other Python threads of the job hold the GIL (`--gil` ticks, or their CPU from "
                "schedstat) and the loop thread is not running for it (off-CPU, or waiting for a "
                "CPU its own threads fill); in a server, the request handlers' own hold is left "
                "out (it is the request path's work: SERVE002, or the forwards SERVE001 batches)"
            ),
            fix="names the threads and their functions; move the work to a process",
            measured=(
                Measured(
                    impact="GPU idle while the loop waits for the GIL",
                    speedup="the wait removed, capped by the GPU's busy time",
                ),
            ),
        ),
    )
)


def gil_judged(profile: LoopProfile, th: Thresholds) -> bool:
    """Whether the GIL check had its own evidence: the loop thread's schedstat readings, and
    who held the GIL (--gil ticks, or the other Python threads' schedstat)."""
    g = profile.gil
    if g is None or g.readings < th.gil_min_readings:
        return False
    return g.ticks >= th.gil_min_ticks or g.other_cpu is not None


# what the profiled thread is, by the job's kind (measures/workload.py)
ROLE = {
    "training": "training loop thread",
    "inference": "inference loop thread",
    "server": "serving thread",
}


def _without(g: GilStats, handlers: frozenset[str]) -> GilStats:
    """The GIL's hold with the request path's threads' part taken out (SERVE002's host work,
    the forwards SERVE001 batches: one cause, one id): the others' share and the wait scaled
    down by the share of the holders that are left."""
    held = sum(share for name, share, _ in g.holders if name in handlers)
    total = sum(share for _, share, _ in g.holders)
    if held <= 0 or total <= 0:
        return g
    # the others' hold (the larger of the --gil ticks and their schedstat CPU) split as the
    # holders' shares split it
    scale = max(0.0, total - held) / total
    return replace(
        g,
        other_share=g.other_share * scale,
        wait_share=g.wait_share * scale,
        holders=tuple(h for h in g.holders if h[0] not in handlers),
    )


def find(c: Context) -> list[Finding]:
    """GIL001 when the loop's estimated GIL wait and the others' GIL share cross thresholds.

    The wait is estimated as the loop thread's off-CPU time (procfs schedstat) not explained
    by blocking work (data, sync, I/O, collectives, checkpoints), capped by the share of time
    other threads were seen holding the GIL (py-spy --gil)."""
    kind = c.workload.kind if c.workload else "training"
    handlers = handler_names(c.view) if kind == "server" else frozenset()
    profile = c.profile
    th = c.th
    gpu_idle_caused = c.caused("gil_wait")
    gpu_idle = c.idle
    g = profile.gil
    if g is None or profile.thread is None:
        return []
    whole = g.wait_share
    g = _without(g, handlers)
    if gpu_idle_caused is not None and whole > 0:
        gpu_idle_caused *= g.wait_share / whole
    # The wait rests on the loop thread's schedstat and on who held the GIL (--gil ticks),
    # not on the loop's stack samples: a loop starved of the GIL is off-CPU in a futex, so
    # py-spy's loop samples are few exactly when GIL001 is the answer.
    if profile.samples < th.min_loop_samples and not gil_judged(profile, th):
        return []
    if g.wait_share < th.gil_wait_warn or g.other_share < th.gil_other_min:
        return []
    # each schedstat reading covers 0.2-1 s of the thread's time: one independent look
    indep = max(g.independent_ticks(), g.readings) * SAMPLE_CORRELATION  # divided back
    conf = min(
        confidence_above(g.wait_share, th.gil_wait_warn, max(profile.samples, indep)),
        confidence_above(g.other_share, th.gil_other_min, indep),
    )
    if conf < th.min_confidence:
        return []
    holders = [h for h in g.holders if h[1] >= 0.02][:4]
    named = "; ".join(
        f"'{name}' {share:.0%}" + (f" in {where}" if where else "")
        for name, share, where in holders
    )
    loop = profile.thread.thread if profile.thread else "the loop thread"
    role = (
        ROLE.get(kind, ROLE["training"])
        if profile.samples
        else "main thread (still before its loop)"
    )
    waiting = 1.0 - (profile.loop_cpu or 0.0)
    msg = (
        f"Other Python threads hold the GIL {g.other_share:.0%} of the time ({named}). "
        f"The {role} '{loop}' is not running {waiting:.0%} of the time (off-CPU "
        f"{g.loop_off_cpu or 0:.0%}, waiting for a CPU {profile.loop_runqueue or 0:.0%}); "
        f"{g.wait_share:.0%} is not explained by data, sync or I/O waits: it is waiting "
        f"for the GIL."
    )
    ev = [
        th.evidence(
            "gil_wait_warn",
            "gil_wait_share",
            round(g.wait_share, 4),
            "ratio",
            ">=",
            "stacks+procfs",
        ),
        th.evidence(
            "gil_other_min",
            "gil_held_by_other_threads",
            round(g.other_share, 4),
            "ratio",
            ">=",
            "py-spy --gil, procfs schedstat",
        ),
        Evidence("gil_held_by_loop_thread", round(g.loop_share, 4), "ratio", source="py-spy --gil"),
    ]
    if g.other_cpu is not None:
        ev.append(
            Evidence(
                "other_python_threads_cpu",
                round(g.other_cpu, 3),
                "cores",
                source="procfs schedstat",
            )
        )
    if profile.loop_runqueue is not None:
        ev.append(
            Evidence(
                "loop_thread_runqueue_wait",
                round(profile.loop_runqueue, 4),
                "ratio",
                source="procfs schedstat",
            )
        )
    if g.loop_off_cpu is not None:
        ev.append(
            Evidence(
                "loop_thread_off_cpu", round(g.loop_off_cpu, 4), "ratio", source="procfs schedstat"
            )
        )
    ev.append(th.evidence("gil_min_ticks", "gil_ticks", g.ticks, "samples", ">=", "py-spy --gil"))
    ev.append(
        th.evidence(
            "gil_min_readings",
            "loop_thread_schedstat_readings",
            g.readings,
            "count",
            ">=",
            "procfs schedstat",
        )
    )
    for name, share, _where in holders:
        ev.append(Evidence(f"gil_share[{name}]", round(share, 4), "ratio", source="py-spy --gil"))
    top = holders[0] if holders else ("a background thread", 0.0, "")
    actions = (
        f"move the work of thread '{top[0]}'"
        + (f" ({top[2]})" if top[2] else "")
        + " into a separate process (multiprocessing, or a DataLoader worker) so it has its "
        "own GIL",
        "or make it cheaper or less frequent (e.g. log/aggregate metrics every 50 steps "
        "instead of every step), or move it to native code that releases the GIL",
        "on Python 3.13+, a free-threaded build (python3.13t) removes the GIL",
    )
    impact = g.wait_share if gpu_idle_caused is None else gpu_idle_caused
    if impact < th.gil_wait_warn:
        return []
    speed = speedup_from_impact(g.wait_share)
    if gpu_idle is not None:
        speed = min(speed, speedup_from_impact(gpu_idle))
    return [
        new_finding(
            "GIL001",
            th,
            confidence=conf,
            impact=impact,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation(
                "Take CPU-bound Python work off the training process's GIL", actions
            ),
            expected_speedup=speed,
            location=location_of(profile.stacks_by_category.get("other", ())),
            signals=("py-spy --gil", "stacks", "procfs"),
            speedup_basis="the loop's GIL wait removed"
            + ("; capped by the GPU's busy time" if gpu_idle is not None else ""),
        )
    ]


FINDER = Finder("gil", find, (GIL001,))
