"""DATA003: the DataLoader's workers are re-created every epoch (persistent_workers=False)
and the loop waits for them at each epoch's start.

It rests on the process probe seeing worker processes end and new ones start during the loop
(generations: processes started and ended over the most alive at once), with the loop waiting
for batches. The hooks' long steps (one per epoch start) give the wait at each start.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.measures.loop import LoopProfile, location_of
from gpudiag.analyzers.measures.steps import long_steps
from gpudiag.analyzers.measures.summary import SAMPLE_CORRELATION, confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.timeline.timeline import Aggregate


def data_wait_spec(fid: str, title: str, doc: Doc) -> Spec:
    """The spec of a cause of the loop's wait for batches (DATA001-003): a host cause of GPU
    idle, an error from `data_wait_error`, its time in data_wait; it claims the loop's time
    and reads the job's own threads' claim (HOST003)."""
    return Spec(
        fid,
        title,
        "host",
        True,
        "data_wait_error",
        time_in="data_wait",
        claims=("loop_time",),
        reads=("own_threads",),
        doc=doc,
    )


DATA003 = register(
    data_wait_spec(
        "DATA003",
        "DataLoader workers re-created every epoch",
        Doc(
            means=(
                "the DataLoader's workers are re-created every epoch (`persistent_workers=False`)"
                " with a costly dataset or worker initialisation: the process probe sees worker "
                "processes start and end during the loop (at least `worker_respawn_min` "
                "generations re-created: processes started and ended over the most alive at once)"
                " while the loop waits for batches at each epoch's start (the hooks' long steps, "
                "one per epoch start; else the loop's whole wait) >= `data_wait_warn`. It "
                "replaces DATA001/DATA002 for that wait"
            ),
            fix=(
                "`persistent_workers=True` (`try` applies it), the DataLoader built once outside "
                "the epoch loop, cheaper per-worker set-up"
            ),
        ),
    )
)


@dataclass(frozen=True)
class Churn:
    """Worker processes started and ended while the loop ran."""

    starts: float
    exits: float
    workers: float  # the most alive at once

    @property
    def respawns(self) -> float:
        """Generations of workers re-created (each ended and replaced by a new one)."""
        return min(self.starts, self.exits) / self.workers if self.workers else 0.0


def worker_churn(tl: Aggregate) -> Churn | None:
    """The churn the process probe saw; None without its worker counts."""
    starts = tl.rollup("process", "worker_starts", scope="workers")
    exits = tl.rollup("process", "worker_exits", scope="workers")
    most = tl.maximum("process", "procs", scope="workers")
    if starts is None or exits is None or not most:
        return None
    return Churn(starts.total, exits.total, most)


def _wait(profile: LoopProfile, metrics: dict) -> tuple[float, float, str]:
    """(the loop's wait for batches, samples behind it, source), as DATA001 measures it."""
    exact = metrics.get("data_wait_ratio")
    steps = metrics.get("steps") or 0
    if exact is not None and steps >= 10:
        return exact, max(profile.samples, steps * SAMPLE_CORRELATION), "in-process hooks"
    return profile.share("data_wait"), profile.samples, "stacks"


def churn_findings(c: Context) -> list[Finding]:
    """DATA003 when workers are re-created during the loop and the loop waits for batches
    (data.py's finder asks it first)."""
    tl, profile, th = c.view, c.profile, c.th
    churn = worker_churn(tl)
    if churn is None or churn.respawns < th.worker_respawn_min:
        return []
    wait, n, source = _wait(profile, c.metrics)
    if n < th.min_loop_samples and source == "stacks":
        return []
    ls = long_steps(tl)
    # the wait at the epochs' starts: the long steps, when the hooks timed about one per epoch
    timed = ls is not None and 0 < ls.long <= 3 * churn.respawns + 1
    at_start = min(wait, ls.share) if timed and ls is not None else wait
    conf = confidence_above(at_start, th.data_wait_warn, n)
    if at_start < th.data_wait_warn or conf < th.min_confidence:
        return []
    ev = [
        th.evidence(
            "data_wait_warn",
            "data_wait_at_epoch_start_share",
            round(at_start, 4),
            "ratio",
            ">=",
            source if at_start == wait else "in-process hooks",
        ),
        Evidence(
            "worker_generations_recreated",
            round(churn.respawns, 1),
            "count",
            float(th.worker_respawn_min),
            ">=",
            "worker_respawn_min",
            "procfs",
        ),
        Evidence("worker_processes_started", churn.starts, "count", source="procfs"),
        Evidence("worker_processes_ended", churn.exits, "count", source="procfs"),
        Evidence("dataloader_workers", churn.workers, "count", source="procfs"),
        Evidence("data_wait_share", round(wait, 4), "ratio", source=source),
    ]
    per = ""
    if timed and ls is not None:
        ev.append(
            Evidence("seconds_lost_per_epoch_start", round(ls.pause_s, 3), "s", source="hooks")
        )
        per = f", about {ls.pause_s:.2f} s at each epoch's start"
    msg = (
        f"The DataLoader's {churn.workers:.0f} workers were re-created "
        f"{churn.respawns:.0f} times during the loop ({churn.starts:.0f} worker processes "
        f"started, {churn.exits:.0f} ended): persistent_workers=False starts them again, "
        f"with their dataset and worker initialisation, every epoch. The loop waits for them "
        f"{at_start:.0%} of the time{per}."
    )
    actions = (
        "DataLoader(..., persistent_workers=True): the workers, and what they initialised, "
        "stay alive between epochs",
        "build the DataLoader once, outside the epoch loop (a loader made per epoch starts "
        "its workers again whatever persistent_workers says)",
        "make the per-worker initialisation cheaper (worker_init_fn, the dataset's lazy "
        "set-up): load shared tables once in the main process before the workers fork",
    )
    return [
        new_finding(
            "DATA003",
            th,
            confidence=conf,
            impact=at_start,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation("Keep the workers: persistent_workers=True", actions),
            expected_speedup=speedup_from_impact(at_start),
            location=location_of(profile.stacks_by_category.get("data_wait", ())),
            signals=("procfs",) + (("hooks",) if source != "stacks" else ("stacks",)),
            speedup_kind="bound",
            speedup_basis="a bound: the wait for new workers at each epoch's start removed",
            fix={"kind": "dataloader", "values": {"persistent_workers": True}},
        )
    ]
