"""CKPT001: synchronous checkpoint saves take a large share of the loop's wall time."""

from __future__ import annotations

import math

from gpudiag.analyzers.loop import LoopProfile
from gpudiag.analyzers.metrics import confidence_above
from gpudiag.analyzers.results import (
    Evidence,
    Finding,
    Location,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.rules import Classifier, parse_stack
from gpudiag.analyzers.timeline import Timeline


def save_episodes(tl: Timeline, profile: LoopProfile, clf: Classifier
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


def checkpoint_findings(tl: Timeline, profile: LoopProfile, clf: Classifier, th) -> list[Finding]:
    """CKPT001 with the save call site, how often it runs and how long one save takes."""
    share = profile.share("checkpoint")
    if profile.samples < th.min_loop_samples or share < th.checkpoint_warn:
        return []
    conf = confidence_above(share, th.checkpoint_warn, profile.samples)
    if conf < th.min_confidence:
        return []
    saves, samples, loc = save_episodes(tl, profile, clf)
    w = tl.windows.get("all")
    rate = w.rate_hz if w and w.rate_hz else 100.0
    sampled_s = w.duration_s if w and w.duration_s else tl.duration_s
    ev = [Evidence("checkpoint_share", round(share, 4), "ratio", th.checkpoint_warn, ">=",
                   "checkpoint_warn", "stacks")]
    detail = ""
    actions = []
    if saves >= 1 and sampled_s > 0:
        per_save = samples / saves / rate
        every = sampled_s / saves
        ev += [Evidence("saves_seen", saves, "count", source="stacks"),
               Evidence("seconds_per_save", round(per_save, 3), "s", source="stacks"),
               Evidence("seconds_between_saves", round(every, 2), "s", source="stacks")]
        detail = (f" {saves:.0f} saves seen in {sampled_s:.0f} s of sampling: one every "
                  f"{every:.1f} s, each blocking the loop about {per_save:.2f} s.")
        factor = max(2, math.ceil(share / (th.checkpoint_warn / 2)))
        actions.append(f"save {factor}x less often (every {every * factor:.0f} s instead of "
                       f"every {every:.0f} s) to bring saves under "
                       f"{th.checkpoint_warn / 2:.0%} of the time")
    else:
        actions.append("save less often (e.g. every N steps with N several times larger)")
    actions += [
        "save asynchronously: torch.distributed.checkpoint.async_save(...), or copy the "
        "state_dict to CPU and write it from a background thread/process",
        "write to fast local disk first and upload to shared storage in the background",
    ]
    where = f" at {loc}" if loc else ""
    msg = (f"Synchronous checkpoint saves{where} take {share:.0%} of the training loop's "
           f"time.{detail}")
    return [Finding(
        "CKPT001", "Synchronous checkpoint saves stall training",
        "error" if share >= th.checkpoint_error else "warning", conf, share, msg, tuple(ev),
        Recommendation("Save less often, or asynchronously", tuple(actions)),
        speedup_from_impact(share), loc, signals=("stacks",))]
