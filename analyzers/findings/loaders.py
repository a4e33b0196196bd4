"""The loaders' own time: do they compute or wait (schedstat), and DATA001 for waiting ones."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpudiag.analyzers.measures.loop import LoopProfile
from gpudiag.analyzers.model.catalogue import new_finding
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Location,
    Recommendation,
    speedup_from_step,
)
from gpudiag.analyzers.model.thresholds import Thresholds


def loader_on_cpu(profile: LoopProfile, metrics: dict, workers: int) -> float | None:
    """Share of the loaders' loading time spent on a CPU (running or runnable), from schedstat.

    Workers: their CPU and run-queue wait (cores: a worker waiting for a CPU on a busy box
    computes, it does not wait on I/O) over their number. The loop thread loading with
    num_workers=0:
    the CPU it used beyond the rest of the step (which runs on the CPU), over the time it
    spent loading. None when not measured.
    """
    if workers > 0:
        cores = metrics.get("worker_cpu_cores")
        if cores is None:
            return None
        cores += metrics.get("worker_runqueue_cores") or 0.0
        return min(1.0, max(0.0, cores / workers))
    load = profile.share("data_wait")
    if profile.loop_cpu is None or load <= 0:
        return None
    busy = profile.loop_cpu + (profile.loop_runqueue or 0.0)
    blocked = sum(profile.share(c) for c in ("storage_io", "sync", "checkpoint", "collective"))
    rest = max(0.0, 1.0 - load - blocked - profile.share("gil_wait"))
    return min(1.0, max(0.0, busy - rest) / load)


@dataclass(frozen=True)
class WaitingLoaders:
    """What DATA001 for waiting loaders rests on: the loop's wait for batches (its share,
    confidence and impact), the loaders and their off-CPU share of their loading time, the
    GPU's busy bound on the speed-up (`floor`) and where the loading happens, in words."""

    wait: float
    workers: int
    off: float
    floor: float | None
    conf: float
    impact: float
    where: str


def waiting_loaders_finding(
    w: WaitingLoaders, th: Thresholds, ev: list[Evidence], loc: Location | None
) -> Finding:
    """DATA001 for loaders that wait (sleep, network, object store): more workers overlap the
    waits whatever the idle cores, since a waiting loader needs little CPU."""
    wait, workers, off, floor = w.wait, w.workers, w.off, w.floor
    rest = max(1e-3, 1.0 - wait)
    load = wait if workers == 0 else float(workers)  # the step normalised to 1
    n = max(workers + 1, 2, math.ceil(load / rest - 1e-9))
    speed = speedup_from_step(max(rest, load / n))
    if floor:
        speed = min(speed, floor)
    msg = (
        f"The loop waits for batches {wait:.0%} of the time (num_workers={workers}), and the "
        f"loaders are off-CPU {off:.0%} of their loading time: they wait (a sleep, a network "
        f"or object-store read), they do not compute.{w.where} More workers overlap those waits "
        "even on a busy box."
    )
    actions = (
        f"DataLoader(..., num_workers={n})",
        "persistent_workers=True (keep workers alive between epochs)",
        "prefetch_factor=4 (more requests in flight per worker)",
        "or batch/asynchronously issue the reads inside the dataset (one request per batch)",
    )
    return new_finding(
        "DATA001",
        th,
        confidence=w.conf,
        impact=w.impact,
        message=msg,
        evidence=tuple(ev),
        recommendation=Recommendation(f"Overlap the loaders' waits: num_workers={n}", actions),
        expected_speedup=speed,
        location=loc,
        signals=("stacks", "procfs"),
        speedup_basis=f"{n} loaders waiting in parallel against the rest of the step "
        f"({rest:.0%} of it)"
        + ("; capped by the GPU's busy time" if floor and speed == floor else ""),
        fix={"kind": "dataloader", "values": {"num_workers": n, "persistent_workers": True}},
    )
