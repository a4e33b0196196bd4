"""START001: a note when the job's start-up is a large share of the run."""

from __future__ import annotations

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.model.catalogue import Doc, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation

START001 = register(
    Spec(
        "START001",
        "Start-up takes a large share of the run",
        "run",
        False,
        None,
        always_note=True,
        doc=Doc(
            means="(note) start-up before the first step is a large share of the run (`run` mode)",
            fix="amortise it: more work per job, deferred imports, compile caches",
        ),
    )
)


def find(c: Context) -> list[Finding]:
    """START001 (a note) when start-up is a large share of the run."""
    if c.workload is not None and c.workload.kind == "server":
        return []
    phases = c.phases
    th = c.th
    share = phases.get("startup_share") or 0.0
    if not phases:
        return []
    if (
        share < th.startup_note
        or phases.get("startup_s", 0.0) < th.startup_note_min_s
        or phases.get("source") == "whole run"
    ):
        return []
    top = phases.get("startup_top") or []
    where = "; ".join(f"{t['where']} {t['share']:.0%}" for t in top)
    msg = (
        f"The job spent {phases['startup_s']:.1f} s before its first step, {share:.0%} of "
        f"the {phases['startup_s'] + phases['loop_s'] + phases['shutdown_s']:.0f} s run"
        + (f" (start-up samples: {where})" if where else "")
        + ". The findings above cover "
        "the loop only; for a short job, start-up is a cost of its own."
    )
    ev = (
        th.evidence("startup_note", "startup_share", round(share, 4), "ratio", ">=", "run window"),
        Evidence("startup_s", phases["startup_s"], "s", source=phases.get("source")),
    )
    actions = (
        "run more steps per job so start-up is amortised (one job instead of many short ones)",
        "defer heavy imports; load data and build the model once",
        "cache compiled artefacts (TORCHINDUCTOR_CACHE_DIR) when using torch.compile",
    )
    return [
        new_finding(
            "START001",
            th,
            confidence=0.9,
            impact=0.0,
            message=msg,
            evidence=ev,
            recommendation=Recommendation("Amortise start-up over more work", actions),
            expected_speedup=1.0,
            signals=("run window",),
            speedup_basis="not a loop speed-up: start-up time is outside the loop",
        )
    ]


FINDER = Finder("startup", find, (START001,))
