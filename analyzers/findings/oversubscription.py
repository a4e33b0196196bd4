"""HOST003: the job's own threads oversubscribe the CPU cores available to it.

Intra-op and inter-op pools (torch, OpenMP, MKL, OpenBLAS) of the main process and of each
DataLoader worker wider than the cores the job may use (its affinity, its cgroup quota) make
the loop thread wait in the run queue behind its own threads, and every parallel region wait
for its slowest thread. It rests on direct signals: the loop thread's run-queue wait
(schedstat) and the part of it the job's own threads cause (`runqueue_split`: the cores they
want beyond those available), and the threads they run. Other processes' part is HOST002's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.findings.host_contention import gpu_evidence, idle_explained, saturated_note
from gpudiag.analyzers.measures.loop import (
    job_cores,
    job_cores_wanted,
    runqueue_split,
    thread_series_samples,
)
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Aggregate

HOST003 = register(
    Spec(
        "HOST003",
        "The job's own threads oversubscribe the CPU",
        "host",
        True,
        note_title="The job's own threads oversubscribe the CPU, but the GPU does not wait",
        claims=("loop_time", "own_threads"),
        doc=Doc(
            means=(
                "the job's own threads oversubscribe the cores it may use (its affinity, capped "
                "by its cgroup's CPU quota): intra-op/inter-op pools (torch, OpenMP, MKL, "
                "OpenBLAS) of the main process and each worker want (running plus run-queue wait)"
                " at least `job_excess_cores_min` cores beyond those, and the part of the loop "
                "thread's run-queue wait they cause (the same split HOST002 uses) is >= "
                "`job_runqueue_warn`. HOST002 keeps the other processes' part and never fires for"
                " the job's own. Its confidence, as HOST002's, counts the time the loop thread's "
                "schedstat readings cover as stack samples at 100 Hz. It is decided before the "
                "input pipeline: a DATA001/DATA002 wait found beside it is a note after it (the "
                "loaders run slower behind the job's own threads)"
            ),
            fix=(
                "the thread counts that fit: `torch.set_num_threads(N)` (`OMP_NUM_THREADS=N`) for"
                " the main process, one thread per DataLoader worker (`worker_init_fn`, "
                "`OMP_NUM_THREADS=1`), pools sized from `os.sched_getaffinity`, not "
                "`os.cpu_count()`"
            ),
        ),
    )
)


@dataclass(frozen=True)
class JobThreads:
    """The job's threads and the cores they want against the cores it may use."""

    cores: float  # cores available to the job
    source: str  # where `cores` comes from
    want: float  # cores its threads ran plus waited for
    main_threads: float  # threads of the main process (mean)
    main_runnable: float  # of those, runnable or running at a tick (mean)
    workers: int  # DataLoader workers (most alive at once)
    worker_threads: float  # threads per worker (mean)
    worker_cores: float  # cores the workers ran


def job_threads(tl: Aggregate) -> JobThreads | None:
    """What the process probe saw of the job's threads; None without its readings."""
    cores = job_cores(tl)
    main = tl.mean("process", "threads", scope="target")
    if cores is None or main is None:
        return None
    allowed = tl.mean("process", "cpus_allowed", scope="target")
    running = tl.mean("process", "running_share", scope="target") or 0.0
    procs = tl.maximum("process", "procs", scope="workers") or 0.0
    w_threads = tl.mean("process", "threads", scope="workers") or 0.0
    w_procs = tl.mean("process", "procs", scope="workers") or 0.0
    return JobThreads(
        cores,
        "affinity and cgroup quota" if allowed else "host cores",
        job_cores_wanted(tl),
        main,
        main * running,
        int(round(procs)),
        w_threads / w_procs if w_procs > 0 else 0.0,
        tl.mean("process", "cpu_cores", scope="workers") or 0.0,
    )


def fitting_threads(jt: JobThreads) -> tuple[int, int]:
    """(intra-op threads for the main process, threads per worker) that fit the cores: each
    busy worker keeps a core, the main process gets the rest (at least one)."""
    if jt.workers <= 0:
        return max(1, int(jt.cores)), 0
    busy = min(jt.workers, max(1, math.ceil(jt.worker_cores - 0.25)))
    return max(1, int(jt.cores) - busy), 1


def _evidence(rq: float, total: float, jt: JobThreads, th: Thresholds) -> list[Evidence]:
    excess = jt.want - jt.cores
    ev = [
        th.evidence(
            "job_runqueue_warn",
            "loop_runqueue_wait_for_own_threads",
            round(rq, 4),
            "ratio",
            ">=",
            "procfs schedstat",
        ),
        th.evidence(
            "job_excess_cores_min",
            "job_cores_wanted_beyond_available",
            round(excess, 2),
            "cores",
            ">=",
            "procfs schedstat",
        ),
        Evidence("loop_thread_runqueue_wait", round(total, 4), "ratio", source="procfs schedstat"),
        Evidence("job_cores_available", round(jt.cores, 2), "cores", source=jt.source),
        Evidence("job_cores_wanted", round(jt.want, 2), "cores", source="procfs schedstat"),
        Evidence("main_process_threads", round(jt.main_threads, 1), "count", source="procfs"),
        Evidence(
            "main_process_runnable_threads",
            round(jt.main_runnable, 1),
            "count",
            source="procfs",
        ),
    ]
    if jt.workers:
        ev += [
            Evidence("dataloader_workers", float(jt.workers), "count", source="procfs"),
            Evidence("threads_per_worker", round(jt.worker_threads, 1), "count", source="procfs"),
        ]
    return ev


def _actions(jt: JobThreads) -> tuple[str, ...]:
    main, per_worker = fitting_threads(jt)
    cores = f"{jt.cores:g}"
    acts = [
        f"torch.set_num_threads({main}) in the main process (or OMP_NUM_THREADS={main} "
        f"MKL_NUM_THREADS={main} in its environment): {main} intra-op threads"
        + (f" beside {jt.workers} busy workers" if per_worker else "")
        + f" fit the {cores} cores available"
    ]
    if per_worker:
        acts.append(
            "one thread per DataLoader worker: DataLoader(..., worker_init_fn=lambda _: "
            "torch.set_num_threads(1)), and OMP_NUM_THREADS=1 (MKL_NUM_THREADS, "
            "OPENBLAS_NUM_THREADS) for the libraries the workers call"
        )
    acts.append("torch.set_num_interop_threads(1) when the job runs no parallel graphs")
    acts.append(
        "size pools from the cores the job may use (len(os.sched_getaffinity(0)), the "
        "container's CPU limit), not from os.cpu_count()"
    )
    return tuple(acts)


def find(c: Context) -> list[Finding]:
    """HOST003 when the loop thread waits for a CPU behind the job's own threads; graded by
    the GPU idle it explains where there is a GPU signal (`cp`), as HOST002."""
    tl = c.view
    profile = c.profile
    th = c.th
    cp = c.cp
    total = profile.loop_runqueue
    if profile.thread is None or total is None or profile.samples < th.host_min_loop_samples:
        return []
    jt = job_threads(tl)
    if jt is None or jt.want - jt.cores < th.job_excess_cores_min:
        return []
    rq, _others = runqueue_split(tl, profile.loop_cpu, total)
    if rq < th.job_runqueue_warn:
        return []
    samples = thread_series_samples(tl, "runqueue_wait", profile.thread.tid)
    conf = confidence_above(rq, th.job_runqueue_warn, samples)
    if conf < th.min_confidence:
        return []
    workers = f" and {jt.workers} DataLoader workers ({jt.worker_threads:.0f} threads each)"
    msg = (
        f"The loop thread waits for a CPU {total:.0%} of the time, {rq:.0%} of the time "
        f"behind the job's own threads: they want {jt.want:.1f} cores (running and "
        f"runnable) of the {jt.cores:g} available to the job ({jt.source}). The main process runs "
        f"{jt.main_threads:.0f} threads ({jt.main_runnable:.1f} runnable at a time)"
        + (workers if jt.workers else "")
        + ": thread pools wider than the cores wait for each other at every parallel region."
    )
    main, _ = fitting_threads(jt)
    ev = _evidence(rq, total, jt, th)
    explained = idle_explained(cp, rq)
    impact = rq if explained is None else explained
    note = impact < th.job_runqueue_warn
    if cp is not None and explained is not None:
        ev += gpu_evidence(cp, explained, th.job_runqueue_warn, "job_runqueue_warn")
        msg += saturated_note(cp, explained) if note else ""
    return [
        new_finding(
            "HOST003",
            th,
            note=note,
            confidence=conf,
            impact=impact,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation(
                f"Size the thread pools to the cores: torch.set_num_threads({main})",
                _actions(jt),
            ),
            expected_speedup=speedup_from_impact(impact),
            signals=("procfs schedstat", "procfs"),
            speedup_kind="bound",
            speedup_basis="the loop thread's run-queue wait behind the job's own threads removed"
            + ("" if explained is None else ", capped by the GPU idle it explains"),
        )
    ]


FINDER = Finder("oversubscription", find, (HOST003,))
