"""HOST002: other processes on the box take the CPU the job's loop thread needs.

It rests on direct signals only: the loop thread's run-queue wait (schedstat: runnable, not
running) and the CPU the processes outside the job use (the host probe's scan), naming the
top ones. The idle-cores reading alone never makes it.
"""

from __future__ import annotations

from gpudiag.analyzers.engine.catalogue import new_finding
from gpudiag.analyzers.engine.context import Context
from gpudiag.analyzers.engine.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.engine.thresholds import Thresholds
from gpudiag.analyzers.measures.loop import LoopProfile, runqueue_split, thread_series_count
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.timeline.timeline import Aggregate


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


def host_contention_findings(tl: Aggregate, profile: LoopProfile, th: Thresholds) -> list[Finding]:
    """HOST002 when the loop thread waits for a CPU and processes outside the job use it."""
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
    readings = thread_series_count(tl, "runqueue_wait", profile.thread.tid)
    conf = confidence_above(rq, th.host_runqueue_warn, readings * 10)
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
    ev = [
        Evidence(
            "loop_runqueue_wait_for_other_processes",
            round(rq, 4),
            "ratio",
            th.host_runqueue_warn,
            ">=",
            "host_runqueue_warn",
            "procfs schedstat",
        ),
        Evidence(
            "loop_thread_runqueue_wait", round(total_rq, 4), "ratio", source="procfs schedstat"
        ),
        Evidence(
            "other_processes_cpu_cores",
            round(others, 2),
            "cores",
            th.host_other_cores_min,
            ">=",
            "host_other_cores_min",
            "procfs",
        ),
    ]
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
            confidence=conf,
            impact=rq,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation(
                "Give the job the CPU it needs: stop or move the other work", actions
            ),
            expected_speedup=speedup_from_impact(rq),
            signals=("procfs schedstat", "procfs"),
            speedup_kind="bound",
            speedup_basis="the loop thread's run-queue wait removed",
        )
    ]


def find(c: Context) -> list[Finding]:
    """HOST002, from the analysis context."""
    return host_contention_findings(c.view, c.profile, c.th)
