"""CKPT001: synchronous checkpoint saves take a large share of the loop's wall time."""

from __future__ import annotations

import math

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.measures.gpu_stats import gpu_compute as compute_share
from gpudiag.analyzers.measures.loop import LoopProfile
from gpudiag.analyzers.measures.rules import Classifier, parse_stack
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Location,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.timeline.timeline import Aggregate

CKPT001 = register(
    Spec(
        "CKPT001",
        "Synchronous checkpoint saves stall training",
        "host",
        True,
        "checkpoint_error",
        time_in="checkpoint",
        claims=("loop_time",),
        doc=Doc(
            means=(
                "synchronous checkpoint saves take a large share of the loop (`torch.save`, "
                "safetensors, DCP, and a save callback's whole save: Lightning's `_atomic_save` "
                "writes through fsspec after serialising into memory)"
            ),
            fix="names the call site, how often and how long; save less often or asynchronously",
            measured=(
                Measured(
                    impact="GPU idle while the loop is inside saves",
                    speedup=(
                        "the whole blocking save removed (device-to-host copies and the write "
                        "included), less the time it waits for queued GPU work"
                    ),
                    checked="x18.5 / x18.5-24",
                ),
            ),
        ),
    )
)


def save_episodes(
    tl: Aggregate, profile: LoopProfile, clf: Classifier
) -> tuple[float, float, Location | None]:
    """(saves seen, samples inside them, call site) from the loop thread's call episodes."""
    saves = samples = 0.0
    best: tuple[float, Location | None] = (0.0, None)
    if profile.thread is None:
        return 0.0, 0.0, None
    for (tid, _thread, anchor), (episodes, count) in tl.episodes.items():
        if tid != profile.thread.tid or clf.category(anchor) != "checkpoint":
            continue
        saves += episodes
        samples += count
        frames = parse_stack(anchor)
        if len(frames) >= 2 and count > best[0]:
            caller = frames[-2]
            best = (count, Location(caller.file, caller.line, caller.function))
    return saves, samples, best[1]


def gpu_drain(share: float, compute: float | None) -> float:
    """Share of the loop a save spends waiting for queued GPU work (GPU-bound, not a stall).

    GPU work runs while the host is outside the saves (1 - share of the time) as far as it
    can; what does not fit there ran while the save waited for it.
    """
    if compute is None:
        return 0.0
    return min(share, max(0.0, compute - (1.0 - share)))


def find(c: Context) -> list[Finding]:
    """CKPT001 with the save call site, how often it runs and how long one save takes.

    The speed-up removes the whole blocking save from the loop: serialisation, the disk
    write and the device-to-host copies of the state_dict, which all run inside the save."""
    tl = c.view
    profile = c.profile
    clf = c.clf
    th = c.th
    gpu_idle_caused = c.caused("checkpoint")
    gpu_compute = compute_share(list(c.stats))
    share = profile.share("checkpoint")
    if profile.samples < th.stack_floor_samples or share < th.checkpoint_warn:
        return []
    conf = confidence_above(share, th.checkpoint_warn, profile.samples)
    if conf < th.min_confidence:
        return []
    saves, samples, loc = save_episodes(tl, profile, clf)
    w = tl.windows.get("all")
    rate = w.rate_hz if w and w.rate_hz else 100.0
    sampled_s = w.duration_s if w and w.duration_s else tl.duration_s
    ev = [
        th.evidence("checkpoint_warn", "checkpoint_share", round(share, 4), "ratio", ">=", "stacks")
    ]
    detail = ""
    actions = []
    if saves >= 1 and sampled_s > 0:
        per_save = samples / saves / rate
        every = sampled_s / saves
        ev += [
            Evidence("saves_seen", saves, "count", source="stacks"),
            Evidence("seconds_per_save", round(per_save, 3), "s", source="stacks"),
            Evidence("seconds_between_saves", round(every, 2), "s", source="stacks"),
        ]
        detail = (
            f" {saves:.0f} saves seen in {sampled_s:.0f} s of sampling: one every "
            f"{every:.1f} s, each blocking the loop about {per_save:.2f} s."
        )
        factor = max(2, math.ceil(share / (th.checkpoint_warn / 2)))
        actions.append(
            f"save {factor}x less often (every {every * factor:.0f} s instead of "
            f"every {every:.0f} s) to bring saves under "
            f"{th.checkpoint_warn / 2:.0%} of the time"
        )
    else:
        actions.append("save less often (e.g. every N steps with N several times larger)")
    actions += [
        "save asynchronously: torch.distributed.checkpoint.async_save(...), or copy the "
        "state_dict to CPU and write it from a background thread/process",
        "write to fast local disk first and upload to shared storage in the background",
    ]
    where = f" at {loc}" if loc else ""
    msg = f"Synchronous checkpoint saves{where} take {share:.0%} of the loop's time.{detail}"
    drain = gpu_drain(share, gpu_compute)
    stall = share - drain
    impact = stall if gpu_idle_caused is None else min(stall, gpu_idle_caused)
    if drain > 0:
        ev.append(
            Evidence(
                "gpu_drain_in_saves",
                round(drain, 4),
                "ratio",
                source="critical path (nvml + stacks)",
            )
        )
    return [
        new_finding(
            "CKPT001",
            th,
            severity_at=max(impact, share),
            confidence=conf,
            impact=impact,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation("Save less often, or asynchronously", tuple(actions)),
            expected_speedup=speedup_from_impact(stall),
            location=loc,
            signals=("stacks",),
            fix={
                "kind": "checkpoint",
                "values": {"every": max(2, math.ceil(share / th.checkpoint_warn * 2))},
            },
            speedup_basis=f"the blocking saves ({share:.0%} of the loop, device-to-host copies "
            "and the write included) taken off the loop"
            + (f", less the {drain:.1%} they wait for queued GPU work" if drain else ""),
        )
    ]


FINDER = Finder("checkpoint", find, (CKPT001,))
