"""HOST002: other processes on the box take the CPU the job's loop thread needs.

It rests on direct signals only: the loop thread's run-queue wait (schedstat: runnable, not
running) and the CPU the processes outside the job use (the host probe's scan), naming the
top ones. The idle-cores reading alone never makes it. With a GPU signal its impact is the
GPU idle the wait explains (the idle the host waits do not take): over a saturated GPU the
contention costs nothing measurable and the finding is a note that says so.
"""

from __future__ import annotations

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.measures.critical_path import CriticalPath
from gpudiag.analyzers.measures.loop import runqueue_split, thread_series_samples
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.timeline.timeline import Aggregate

HOST002 = register(
    Spec(
        "HOST002",
        "Other processes on the box take the CPU the job's threads need",
        "host",
        True,
        note_title="Other processes on the box take CPU, but the GPU does not wait for it",
        claims=("loop_time",),
        doc=Doc(
            means=(
                "other processes on the box take the CPU the loop thread needs: the part of its "
                "schedstat run-queue wait that the processes outside the job cause (the job's own"
                " part is what it would wait with the box to itself: the cores it wants beyond "
                "the box's) >= `host_runqueue_warn`, while those processes use >= "
                "`host_other_cores_min` cores (a direct signal, never the idle-cores reading). It"
                " ranks by its impact like any cause: on a shared box it is often the largest "
                "(see [A busy box](how-it-measures.md#a-busy-box)); its fix also sizes the job's "
                "intra-op pool to the cores the others leave. With a GPU signal its impact is the"
                " GPU idle the wait explains (the idle no host wait takes, at most the wait): "
                "beside a saturated GPU it is a note saying the GPU does not wait for the host "
                "(HOST003 is graded the same way)"
            ),
            fix=(
                "names the top other processes (pid, name, cores); stop/move/renice them, reserve"
                " CPUs (taskset/cpuset, cgroup quota, Kubernetes requests = limits), or an "
                "unshared box"
            ),
            measured=(
                Measured(
                    impact="the loop thread's run-queue wait; with a GPU, the GPU idle it explains",
                    speedup="the run-queue wait removed, capped by that idle",
                ),
            ),
        ),
    )
)


def top_others(tl: Aggregate, n: int = 3) -> list[tuple[str, str, float]]:
    """(pid, name, mean cores over the look) of the processes outside the job using most CPU."""
    scans = tl.matching("host", "other_cpu_cores", scope="others")
    total = sum(r.count for _, r in scans)
    if not total:
        return []
    per: dict[tuple[str, str], float] = {}
    for labels, r in tl.matching("host", "other_cpu_cores", scope="other"):
        key = (labels.get("pid", "?"), labels.get("comm", "?"))
        per[key] = per.get(key, 0.0) + r.total
    ranked = sorted(((k[0], k[1], v / total) for k, v in per.items()), key=lambda x: -x[2])
    return ranked[:n]


def idle_explained(cp: CriticalPath | None, rq: float) -> float | None:
    """The GPU idle the loop's run-queue wait can explain: the idle no host wait takes (the
    loop thread late to launch), at most the wait; None without a GPU signal."""
    left = None if cp is None else cp.not_on_waits()
    return None if left is None else min(rq, left)


def gpu_evidence(
    cp: CriticalPath, explained: float, threshold: float, setting: str
) -> list[Evidence]:
    """The GPU side of the grade: its idle share and the part the wait explains."""
    return [
        Evidence(
            "gpu_idle_share", round(cp.gpu_idle or 0.0, 4), "ratio", source="nvml utilization"
        ),
        Evidence(
            "gpu_idle_explained_by_runqueue_wait",
            round(explained, 4),
            "ratio",
            threshold,
            ">=",
            setting,
            "critical path (nvml + loop)",
        ),
    ]


def saturated_note(cp: CriticalPath, explained: float) -> str:
    """The message's ending when the GPU does not wait for the host."""
    return (
        f" The GPU is busy {1 - (cp.gpu_idle or 0.0):.0%} of the loop and the wait explains "
        f"{explained:.0%} of its idle: the GPU does not wait for the host, so the contention "
        "costs nothing measurable now (it will once the GPU work gets faster)."
    )


def find(c: Context) -> list[Finding]:
    """HOST002 when the loop thread waits for a CPU and processes outside the job use it;
    graded by the GPU idle it explains where there is a GPU signal (`cp`)."""
    tl = c.view
    profile = c.profile
    th = c.th
    cp = c.cp
    rq = profile.loop_runqueue
    others = tl.mean("host", "other_cpu_cores", scope="others")
    if profile.thread is None or rq is None or others is None:
        return []
    if profile.samples < th.host_min_loop_samples:  # a thread still starting is not the loop
        return []
    if others < th.host_other_cores_min:
        return []
    # the part of the wait the other processes cause (the job's own threads cause the rest)
    total_rq = rq
    _, rq = runqueue_split(tl, profile.loop_cpu, total_rq)
    if rq < th.host_runqueue_warn:
        return []
    samples = thread_series_samples(tl, "runqueue_wait", profile.thread.tid)
    conf = confidence_above(rq, th.host_runqueue_warn, samples)
    if conf < th.min_confidence:
        return []
    top = top_others(tl)
    cores = tl.mean("host", "cpu_count") or 1.0
    left = max(1, int(cores - others))
    named = ", ".join(f"pid {pid} '{name}' {cores:.1f} cores" for pid, name, cores in top)
    msg = (
        f"The loop thread waits for a CPU {total_rq:.0%} of the time (runnable, not running), "
        f"{rq:.0%} of it for the processes outside the job, which use {others:.1f} cores"
        + (f" (top: {named})" if named else "")
        + ". Other work on the box takes the CPU the job needs."
    )
    explained = idle_explained(cp, rq)
    impact = rq if explained is None else explained
    note = impact < th.host_runqueue_warn
    if cp is not None and explained is not None:
        msg += saturated_note(cp, explained) if note else ""
    ev = [
        th.evidence(
            "host_runqueue_warn",
            "loop_runqueue_wait_for_other_processes",
            round(rq, 4),
            "ratio",
            ">=",
            "procfs schedstat",
        ),
        Evidence(
            "loop_thread_runqueue_wait", round(total_rq, 4), "ratio", source="procfs schedstat"
        ),
        th.evidence(
            "host_other_cores_min",
            "other_processes_cpu_cores",
            round(others, 2),
            "cores",
            ">=",
            "procfs",
        ),
    ]
    if cp is not None and explained is not None:
        ev += gpu_evidence(cp, explained, th.host_runqueue_warn, "host_runqueue_warn")
    ev += [
        Evidence(f"other_cpu_cores[{pid} {name}]", round(c, 2), "cores", source="procfs")
        for pid, name, c in top
    ]
    actions = (
        (
            f"stop, move or renice the other processes ({named})"
            if named
            else "stop or renice the other work on the box"
        ),
        f"or size the job's intra-op pool to the cores the others leave: "
        f"torch.set_num_threads({left}) (OMP_NUM_THREADS={left}); a pool wider than the free "
        "cores waits at every parallel region for its slowest thread",
        "reserve CPUs for the job: taskset/cpuset, a cgroup CPU quota for the rest, or "
        "Kubernetes CPU requests = limits (guaranteed QoS)",
        "or run on a box (or node pool) that is not shared",
    )
    return [
        new_finding(
            "HOST002",
            th,
            note=note,
            confidence=conf,
            impact=impact,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation(
                "Give the job the CPU it needs: stop or move the other work", actions
            ),
            expected_speedup=speedup_from_impact(impact),
            signals=("procfs schedstat", "procfs")
            + (cp.signals if explained is not None and cp else ()),
            speedup_kind="bound",
            speedup_basis="the loop thread's run-queue wait removed"
            + ("" if explained is None else ", capped by the GPU idle it explains"),
        )
    ]


FINDER = Finder("host_contention", find, (HOST002,))
