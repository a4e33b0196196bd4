"""HOST002: other processes on the box take the CPU the job's loop thread waits for.

Rests on direct signals, never on a reading of idle cores alone: the loop thread's run-queue
wait (schedstat: runnable, not running) and the CPU that processes outside the job use (the
host probe's pass over them), which names them."""

from __future__ import annotations

from gpudiag.analyzers.catalogue import severity, spec
from gpudiag.analyzers.loop import LoopProfile
from gpudiag.analyzers.metrics import confidence_above
from gpudiag.analyzers.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.thresholds import Thresholds
from gpudiag.analyzers.timeline import Aggregate


def other_processes(view: Aggregate, top: int = 4) -> list[tuple[str, str, float]]:
    """The processes outside the job that used the most CPU: (pid, name, mean cores)."""
    ticks = view.rollup("host", "other_cpu_cores", scope="others")
    n = ticks.count if ticks and ticks.count else 0
    if not n:
        return []
    out = [
        (lab.get("pid", "?"), lab.get("name", "?"), r.total / n)
        for lab, r in view.matching("host", "other_cpu_cores", scope="other")
    ]
    out.sort(key=lambda x: -x[2])
    return out[:top]


def contention_findings(
    view: Aggregate,
    profile: LoopProfile,
    metrics: dict,
    th: Thresholds,
    gpu_idle: float | None = None,
) -> list[Finding]:
    """HOST002 when the loop thread waits in the run queue and other processes hold the CPU."""
    rq = profile.loop_runqueue
    others = metrics.get("others_cpu_cores")
    if rq is None or others is None or profile.thread is None:
        return []
    if rq < th.host_contention_warn or others < th.others_min_cores:
        return []
    rolls = view.matching("process", "runqueue_wait", scope="thread", tid=str(profile.thread.tid))
    conf = confidence_above(rq, th.host_contention_warn, sum(r.count for _, r in rolls))
    if conf < th.min_confidence:
        return []
    named = other_processes(view)
    who = ", ".join(f"{name} (pid {pid}) {cores:.1f} cores" for pid, name, cores in named)
    cpu_count = int(metrics.get("cpu_count") or 1)
    job = (metrics.get("target_cpu_cores") or 0.0) + (metrics.get("worker_cpu_cores") or 0.0)
    msg = (
        f"The training loop thread was ready to run but waiting for a CPU {rq:.0%} of the "
        f"time, while processes outside the job used {others:.1f} of the {cpu_count} cores "
        f"(the job itself {job:.1f})" + (f": {who}." if who else ".")
    )
    ev = [
        Evidence(
            "loop_thread_runqueue_wait",
            round(rq, 4),
            "ratio",
            th.host_contention_warn,
            ">=",
            "host_contention_warn",
            "procfs schedstat",
        ),
        Evidence(
            "other_processes_cpu",
            round(others, 2),
            "cores",
            th.others_min_cores,
            ">=",
            "others_min_cores",
            "procfs",
        ),
        Evidence("job_cpu", round(job, 2), "cores", source="procfs"),
    ]
    for pid, name, cores in named:
        ev.append(Evidence(f"cpu[{name} pid {pid}]", round(cores, 2), "cores", source="procfs"))
    top = named[0] if named else None
    actions = (
        (
            f"stop or move the other work: {top[1]} (pid {top[0]}) uses {top[2]:.1f} cores"
            if top
            else "stop or move the other work on this box"
        ),
        "or give the job its own cores: taskset/cgroups cpuset (e.g. `taskset -c 0-3 python "
        "train.py`), or `nice -n 10` for the other processes",
        "on a shared node, ask the scheduler for exclusive CPUs (Slurm --exclusive, "
        "Kubernetes CPU requests = limits with the static CPU manager)",
    )
    speed = speedup_from_impact(rq)
    if gpu_idle is not None:
        speed = min(speed, speedup_from_impact(gpu_idle))
    return [
        Finding(
            id="HOST002",
            title=spec("HOST002").title,
            severity=severity("HOST002", rq, th),
            confidence=conf,
            impact=rq,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation("Give the job the CPU it waits for", actions),
            expected_speedup=speed,
            signals=("procfs schedstat", "procfs"),
            speedup_basis="a bound: the loop thread's run-queue wait removed"
            + (", capped by the GPU's busy time" if gpu_idle is not None else ""),
            speedup_kind="bound",
        )
    ]
