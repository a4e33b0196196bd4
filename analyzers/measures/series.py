"""The run over time, bounded: what the HTML report and the trace exports draw.

Two small, fixed-size views of a timeline, for people to look at rather than for findings:

* `run_series`: at most `MAX_POINTS` points over the run, each with the GPU utilisation per
  GPU, the steps the hooks timed and their mean step time, and the loop thread's phases
  (its stack samples classified by the frame rules) in that span.
* `loop_stacks`: the loop thread's most sampled stacks over the loop (at most `MAX_STACKS`,
  the rest counted as one "(other stacks)"), as a shared frame table: a flame graph's input.

Pure functions: same timeline, same output.
"""

from __future__ import annotations

import re

from gpudiag.analyzers.measures.loop import find_loop_thread
from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.analyzers.measures.window import find_loop_window
from gpudiag.analyzers.timeline.timeline import Aggregate, ThreadKey, Timeline

MAX_POINTS = 240
MAX_STACKS = 120
MAX_FRAMES = 64  # frames kept per stack (the innermost ones are cut past this depth)
_HEADER_RE = re.compile(r"^(process \d+:|thread \(\d+\))")  # py-spy's pseudo-frames


def _round(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(float(v), nd)


def _point(a: int, b: int, seg: Aggregate, origin: int, clf: Classifier, tid: int | None) -> dict:
    gpus: dict[str, float] = {}
    for labels, roll in seg.matching("gpu", "util_gpu"):
        if roll.mean is not None:
            gpus[labels.get("gpu", "?")] = round(roll.mean, 4)
    steps = seg.rollup("hooks", "step_time_s", kind="step")
    phases: dict[str, float] = {}
    n = 0.0
    for key in seg.threads("all", "target"):
        if tid is not None and key.tid != tid:
            continue
        for (stack, code), count in seg.stacks[key].items():
            cat = clf.category(stack, code)
            phases[cat] = phases.get(cat, 0.0) + count
            n += count
    return {
        "t_s": round((a - origin) / 1e9, 3),
        "dur_s": round((b - a) / 1e9, 3),
        "gpu_util": gpus,
        "steps": int(steps.count) if steps else 0,
        "step_time_s": _round(steps.mean if steps else None, 6),
        "phases": {c: round(v / n, 4) for c, v in sorted(phases.items())} if n else {},
        "samples": int(n),
    }


def _merge_points(points: list[dict]) -> dict:
    """One point standing for several neighbours (weighted by duration and samples)."""
    dur = sum(p["dur_s"] for p in points)
    gpus: dict[str, list[float]] = {}
    for p in points:
        for g, v in p["gpu_util"].items():
            gpus.setdefault(g, []).append(v)
    steps = sum(p["steps"] for p in points)
    timed = [(p["steps"], p["step_time_s"]) for p in points if p["step_time_s"] is not None]
    n = sum(p["samples"] for p in points)
    phases: dict[str, float] = {}
    for p in points:
        for c, v in p["phases"].items():
            phases[c] = phases.get(c, 0.0) + v * p["samples"]
    return {
        "t_s": points[0]["t_s"],
        "dur_s": round(dur, 3),
        "gpu_util": {g: round(sum(v) / len(v), 4) for g, v in gpus.items()},
        "steps": steps,
        "step_time_s": (
            round(sum(k * t for k, t in timed) / max(1, sum(k for k, _ in timed)), 6)
            if timed
            else None
        ),
        "phases": {c: round(v / n, 4) for c, v in sorted(phases.items())} if n else {},
        "samples": n,
    }


def run_series(tl: Timeline, clf: Classifier, thread: ThreadKey | None = None) -> dict:
    """GPU utilisation, steps and the loop thread's phases over the run, bounded in size.

    `t_s` is seconds from the first sample; `loop_start_s`/`loop_end_s` mark the analysis
    window. Empty `points` when the timeline has no samples."""
    spans = tl.spans()
    if not spans or tl.origin_ns is None:
        return {"points": [], "segment_s": 0.0, "loop_start_s": None, "loop_end_s": None}
    origin = tl.start_ns if tl.start_ns is not None else tl.origin_ns
    if thread is None:
        thread = find_loop_thread(tl.whole(), clf)
    tid = thread.tid if thread is not None else None
    points = [_point(a, b, seg, origin, clf, tid) for a, b, seg in spans]
    # the first segment starts at the timeline's origin, which may precede the first sample
    points[0]["t_s"] = max(0.0, points[0]["t_s"])
    group = -(-len(points) // MAX_POINTS)
    if group > 1:
        points = [_merge_points(points[i : i + group]) for i in range(0, len(points), group)]
    win = find_loop_window(tl, clf)
    return {
        "points": points,
        "segment_s": round(spans[0][1] / 1e9 - spans[0][0] / 1e9, 3) * group,
        "loop_start_s": (
            _round((win.start_ns - origin) / 1e9, 3) if win.start_ns is not None else None
        ),
        "loop_end_s": (
            _round((win.end_ns - origin) / 1e9, 3) if win.found and win.end_ns else None
        ),
        "loop_source": win.source,
        "thread": (f"{thread.thread} (tid {thread.tid})" if thread is not None else None),
    }


def loop_stacks(tl: Timeline, clf: Classifier, thread: ThreadKey | None = None) -> dict:
    """The loop thread's most sampled stacks over the loop: a frame table and stacks of
    frame indices (root first) with their sample counts and categories."""
    win = find_loop_window(tl, clf)
    view = tl.window(win.start_ns, win.end_ns) if win.found else tl.whole()
    if thread is None:
        thread = find_loop_thread(view, clf)
    empty: dict = {"thread": None, "samples": 0, "frames": [], "stacks": []}
    if thread is None:
        return empty
    table = view.stacks.get(thread) or {}
    if not table:
        return empty
    ranked = sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))
    frames: list[str] = []
    index: dict[str, int] = {}
    stacks: list[dict] = []
    rest = 0.0
    for (stack, code), count in ranked:
        cat = clf.category(stack, code)
        if cat == "startup":  # imports inside the loop's first window: not the loop's work
            continue
        if len(stacks) >= MAX_STACKS or not stack:
            rest += count
            continue
        ids = []
        for fr in [f for f in stack.split(";") if not _HEADER_RE.match(f)][:MAX_FRAMES]:
            if fr not in index:
                index[fr] = len(frames)
                frames.append(fr)
            ids.append(index[fr])
        stacks.append({"frames": ids, "count": round(count, 3), "category": cat})
    if rest > 0:
        index.setdefault("(other stacks)", len(frames))
        if len(frames) == index["(other stacks)"]:
            frames.append("(other stacks)")
        stacks.append(
            {"frames": [index["(other stacks)"]], "count": round(rest, 3), "category": "other"}
        )
    return {
        "thread": f"{thread.thread} (tid {thread.tid})",
        "samples": round(sum(s["count"] for s in stacks), 3),
        "frames": frames,
        "stacks": stacks,
    }
