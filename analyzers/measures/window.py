"""The analysis window: the training (or inference) loop's steady state, apart from the
job's start-up and shutdown.

The loop starts at the first step the in-process hooks time (after the warm-up steps the
session skips) and ends at the last one; a server's spans its requests; an inference job's
(forwards, no step, no request) its model's forwards, after a warm-up forward or two
followed by a pause. Without hooks, it spans the stack windows in which a quarter or more of
the loop thread's samples are loop work (forward, backward, optimizer, data, sync...).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analyzers.measures.rules import (
    Classifier,
    is_model_loading,
    parse_stack,
    user_location,
)
from gpudiag.analyzers.measures.triton import runs_triton
from gpudiag.analyzers.timeline.timeline import Aggregate, Timeline

STEP_SERIES = ("step_time_s", "first_step")
NOT_LOOP = ("other", "startup")
# a stack window is in the loop when this share of the loop thread's samples is loop work
# (forward, backward, optimizer, data, sync...): a quarter, not a half, because a job (or a
# DDP rank) whose own code between the phases takes most of its step is still in its loop
# (measured: a straggler rank with 60 ms of its own work per step had 30-40% loop work, and
# at a half its loop window kept 49-198 of its ~250 samples, at random)
LOOP_SHARE = 0.25
# A loop loads its model again and again (per batch, per chunk, per request) when a target
# thread is seen loading one in this share of the loop's stack windows, over at least
# LOADING_MIN_WINDOWS of them: a start-up load, or a first one made lazily by the first batch,
# shows in one or two
LOADING_SPREAD = 0.5
LOADING_MIN_WINDOWS = 3
# An inference job's loop spans its model's forwards from the hooks once there are this many
# (the stacks' windows started it 0.7-4.2 s after the first forward in 15 public and planted
# recordings, one look in three of a job loading its model per batch keeping 4 s of 12)
FORWARDS_MIN = 3
# forwards before a pause of WARMUP_GAP_SEGMENTS or more stack segments with none, when they
# are at most this share of all (a warm-up or sanity-check forward, then more set-up), are
# start-up, not the loop
WARMUP_SHARE = 0.05
WARMUP_GAP_SEGMENTS = 3


@dataclass(frozen=True)
class LoopWindow:
    """Where the loop is in the run (ns), and what told us."""

    run_start_ns: int | None
    run_end_ns: int | None
    start_ns: int | None
    end_ns: int | None
    source: str  # "in-process hooks (step times)", "stacks", or "whole run"
    reloads: bool = False  # the job loads its model again and again inside it (per batch)

    @property
    def found(self) -> bool:
        """Whether a loop was found (else the whole run is analysed)."""
        return self.start_ns is not None

    def seconds(self) -> dict[str, float]:
        """Start-up, loop and shutdown durations in seconds."""
        if self.run_start_ns is None or self.run_end_ns is None:
            return {"startup_s": 0.0, "loop_s": 0.0, "shutdown_s": 0.0}
        a = self.start_ns if self.start_ns is not None else self.run_start_ns
        b = min(self.end_ns, self.run_end_ns) if self.end_ns is not None else self.run_end_ns
        return {
            "startup_s": max(0.0, (a - self.run_start_ns) / 1e9),
            "loop_s": max(0.0, (b - a) / 1e9),
            "shutdown_s": max(0.0, (self.run_end_ns - b) / 1e9),
        }


def _hook_span(agg: Aggregate) -> tuple[int | None, int | None]:
    first: int | None = None
    last: int | None = None
    for name in STEP_SERIES:
        r = agg.rollup("hooks", name, kind="step")
        if r is None or r.first_ns is None or r.last_ns is None:  # both set by the first value
            continue
        first = r.first_ns if first is None else min(first, r.first_ns)
        last = r.last_ns if last is None else max(last, r.last_ns)
    return first, last


def _served_span(agg: Aggregate) -> tuple[int | None, int | None]:
    """A server's span from the hooks: its first request's start to its last one's end (no
    steps: the event loop's wait between requests is neither start-up nor shutdown)."""
    r = agg.rollup("hooks", "request_latency_s", kind="request")
    if r is None or r.first_ns is None or r.last_ns is None or r.count < 2:
        return None, None
    return r.first_ns - int((r.maximum or 0.0) * 1e9), r.last_ns


def _forward_span(tl: Timeline) -> tuple[int | None, int | None]:
    """An inference job's span from the hooks' forwards: the first (after a warm-up, see
    WARMUP_SHARE) to the last. None for a Triton server (its counters are the requests, its
    idle time neither start-up nor shutdown)."""
    whole = tl.whole()
    r = whole.rollup("hooks", "forward_time_s", kind="forward")
    if r is None or r.count < FORWARDS_MIN or r.first_ns is None or r.last_ns is None:
        return None, None
    if runs_triton(whole):
        return None, None
    return _after_warmup(tl, r.count) or r.first_ns, r.last_ns


def _forward_interval(tl: Timeline) -> float:
    """Seconds between the model's forwards, on average (the hooks')."""
    r = tl.whole().rollup("hooks", "forward_time_s", kind="forward")
    if r is None or r.count < 2 or r.first_ns is None or r.last_ns is None:
        return 0.0
    return (r.last_ns - r.first_ns) / 1e9 / (r.count - 1)


def _loop_window_after(tl: Timeline, end_ns: int, clf: Classifier) -> int:
    """The end of the stack window in progress at the last forward when its samples are loop
    work (the look stopped the job in its loop, and py-spy's last window came over a second
    later: 73 loop samples of a `generate()` loop's 366 were left out), else `end_ns`."""
    for _s0, s1, seg in tl.spans():
        if s1 <= end_ns or "all" not in seg.windows:
            continue
        loop, total = _loop_thread_share(seg, clf)
        return s1 if total > 0 and loop / total >= LOOP_SHARE else end_ns
    return end_ns


def _after_warmup(tl: Timeline, total: float) -> int | None:
    """The first forward after a warm-up's pause (None: no warm-up seen)."""
    seen = 0.0
    gap = 0
    for _s0, _s1, seg in tl.spans():
        r = seg.rollup("hooks", "forward_time_s", kind="forward")
        if r is None or not r.count:
            gap += 1 if seen else 0
            continue
        if seen and gap >= WARMUP_GAP_SEGMENTS:
            return r.first_ns if seen <= max(2.0, WARMUP_SHARE * total) else None
        seen += r.count
        gap = 0
    return None


def _loop_thread_share(seg: Aggregate, clf: Classifier) -> tuple[float, float]:
    """(samples in loop work, all samples but those loading a model) of the target's busiest
    loop thread in a segment: a loop that loads its model for every batch is judged on what
    it does besides (at 70% loading, its forwards were under LOOP_SHARE, and 2 looks in 3 of
    one job took most of its loop for start-up)."""
    best = (0.0, 0.0)
    for key in seg.threads("all", "target"):
        loop = total = 0.0
        for (stack, code), n in seg.stacks[key].items():
            cat = clf.category(stack, code)
            if cat == "startup" and is_model_loading(parse_stack(stack), readers=False):
                continue
            total += n
            if cat not in NOT_LOOP:
                loop += n
        if loop > best[0]:
            best = (loop, total)
    return best


def _stack_window_end(tl: Timeline, end_ns: int, unit_s: float | None = None) -> int:
    """The loop's end, moved to the end of the stack window that was open at its last step.

    py-spy windows are stamped when they end: the window in progress at the last timed step
    (the look usually ends while the job is still in its loop) holds loop samples, and
    ending the loop at that step would drop them all (measured: 40% of a 15 s run's).
    Not when the job stopped stepping well before the end: that window holds its shutdown.
    `unit_s`: the time between units of work (default: the mean step time).
    """
    whole = tl.whole()
    w = whole.windows.get("all")
    if not w or not w.windows or tl.end_ns is None:
        return end_ns
    steps = whole.rollup("hooks", "step_time_s", kind="step")
    step_s = steps.total / steps.count if steps is not None and steps.count else 0.0
    step_s = step_s if unit_s is None else unit_s
    if (tl.end_ns - end_ns) / 1e9 > 1.0 + 3 * step_s:  # the job left its loop: shutdown
        return end_ns
    back = int(w.duration_s / w.windows * 1e9)
    for s0, s1, seg in tl.spans():
        mid = (s0 + s1) // 2
        if mid <= end_ns or "all" not in seg.windows:
            continue
        return s1 if mid - back < end_ns else end_ns
    return end_ns


def find_loop_window(tl: Timeline | Aggregate, clf: Classifier) -> LoopWindow:
    """The loop's span: from the hooks' step times, else from the stacks, else the whole."""
    start, end = tl.start_ns, tl.end_ns
    if not isinstance(tl, Timeline):
        return LoopWindow(start, end, None, None, "whole run")
    a, b = _hook_span(tl.whole())
    if a is not None and b is not None and b > a:
        return LoopWindow(start, end, a, _stack_window_end(tl, b), "in-process hooks (step times)")
    a, b = _served_span(tl.whole())
    if a is not None and b is not None and b > a:
        return LoopWindow(start, end, a, b, "in-process hooks (requests)")
    a, b = _forward_span(tl)
    if a is not None and b is not None and b > a:
        b2 = _stack_window_end(tl, b, _forward_interval(tl))
        b2 = _loop_window_after(tl, b, clf) if b2 == b else b2
        return LoopWindow(start, end, a, b2, "in-process hooks (forwards)")
    loop_spans = []
    for s0, s1, seg in tl.spans():
        loop, total = _loop_thread_share(seg, clf)
        if total > 0 and loop / total >= LOOP_SHARE:
            loop_spans.append((s0, s1))
    if loop_spans:
        w = tl.whole().windows.get("all")
        back = int(w.duration_s / w.windows * 1e9) if w and w.windows else 0
        # a stack window is stamped when it ends: the loop began within it
        a = loop_spans[0][0] - back // 2
        a = a if start is None else max(start, a)
        return LoopWindow(start, end, a, loop_spans[-1][1], "stacks")
    after = _after_startup(tl, clf)
    if after is not None:
        return LoopWindow(start, end, after[0], after[1], "stacks (after start-up)")
    return LoopWindow(start, end, None, None, "whole run")


def _startup_split(seg: Aggregate, clf: Classifier) -> tuple[float, float, dict]:
    """(start-up samples, all samples, each thread's samples past start-up) of the target's
    threads in a segment."""
    up = total = 0.0
    past: dict = {}
    for key in seg.threads("all", "target"):
        for (stack, code), n in seg.stacks[key].items():
            total += n
            if clf.category(stack, code) == "startup":
                up += n
            else:
                past[key.tid] = past.get(key.tid, 0.0) + n
    return up, total, past


def _after_startup(tl: Timeline, clf: Classifier) -> tuple[int, int] | None:
    """A loop made of the job's own code alone (elementwise passes, a custom kernel loop: no
    forward, backward or data frames): the stack windows after the last one that is mostly
    start-up, where the thread that ran the start-up runs on past it. None when no window was
    start-up (an attach: the whole look is the loop), or that thread never left it (a look
    that saw only start-up, other threads beside it). Without it, a `run` of such a job
    measured its GPU over the start-up too: an H100 at 100% in its loop read 64% busy."""
    spans = [(s0, s1, _startup_split(seg, clf)) for s0, s1, seg in tl.spans()]
    ups = [i for i, (_, _, (up, total, _p)) in enumerate(spans) if total and up / total >= 0.5]
    if not ups or ups[-1] + 1 >= len(spans):
        return None
    starter = _starter(tl, clf)
    after = [(s0, s1) for s0, s1, (_u, _t, past) in spans[ups[-1] + 1 :] if past.get(starter)]
    if starter is None or not after:
        return None
    return spans[ups[-1]][1], after[-1][1]


def _starter(tl: Timeline, clf: Classifier) -> int | None:
    """The tid with the most start-up samples (the thread that imports and sets up)."""
    counts: dict = {}
    whole = tl.whole()
    for key in whole.threads("all", "target"):
        for (stack, code), n in whole.stacks[key].items():
            if clf.category(stack, code) == "startup":
                counts[key.tid] = counts.get(key.tid, 0.0) + n
    return max(counts, key=counts.__getitem__) if counts else None


def phase_summary(tl: Timeline | Aggregate, win: LoopWindow, clf: Classifier) -> dict:
    """Start-up, loop and shutdown: how long each took, and where start-up time went."""
    secs = win.seconds()
    out: dict = {"source": win.source, **{k: round(v, 3) for k, v in secs.items()}}
    total = sum(secs.values())
    out["startup_share"] = round(secs["startup_s"] / total, 4) if total > 0 else 0.0
    if not win.found or not isinstance(tl, Timeline) or secs["startup_s"] <= 0:
        out["startup_top"] = []
        return out
    early = tl.window(None, win.start_ns)
    counts: dict[str, float] = {}
    for key in early.threads("all", "target"):
        for (stack, code), n in early.stacks[key].items():
            if clf.category(stack, code) == "startup":
                label = "importing modules"
            else:
                fr = user_location(stack)
                label = f"{fr.function} ({fr.file}:{fr.line})" if fr else "other start-up work"
            counts[label] = counts.get(label, 0.0) + n
    n = sum(counts.values())
    out["startup_top"] = (
        [
            {"where": k, "share": round(v / n, 4)}
            for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:3]
        ]
        if n
        else []
    )
    return out


def _loads(seg: Aggregate, clf: Classifier) -> bool:
    """Whether a target thread was sampled loading a model in a segment."""
    for key in seg.threads("all", "target"):
        for stack, code in seg.stacks[key]:
            if clf.category(stack, code) == "startup" and is_model_loading(
                parse_stack(stack), readers=False
            ):
                return True
    return False


def loading_windows(tl: Timeline | Aggregate, win: LoopWindow, clf: Classifier) -> tuple[int, int]:
    """(the loop's segments with stack samples in which a target thread loads a model, all its
    segments with stack samples); (0, 0) without a timeline."""
    if not isinstance(tl, Timeline):
        return 0, 0
    seen = loading = 0
    lo, hi = win.start_ns, win.end_ns
    for a, b, seg in tl.spans():
        mid = (a + b) // 2
        if (lo is not None and mid < lo) or (hi is not None and mid > hi):
            continue
        if not any(seg.stacks.get(k) for k in seg.threads("all", "target")):
            continue
        seen += 1
        loading += _loads(seg, clf)
    return loading, seen


def loads_in_loop(tl: Timeline | Aggregate, win: LoopWindow, clf: Classifier) -> bool:
    """Whether the loop loads a model again and again, from the stacks' times alone (each
    segment looked at only when the run loads a model at all: most never do)."""
    if not isinstance(tl, Timeline) or not _loads(tl.whole(), clf):
        return False
    loading, seen = loading_windows(tl, win, clf)
    return seen >= LOADING_MIN_WINDOWS and loading >= LOADING_SPREAD * seen
