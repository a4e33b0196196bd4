"""Bounded PyTorch profiler capture inside the job, summarised inside the job.

Loaded by the in-process hooks (gpudiag_hooks.py) when GPUDIAG_CAPTURE_STEPS=N is set
(`gpudiag run --capture-steps N`). After the warm-up (GPUDIAG_CAPTURE_AFTER optimizer steps,
default 5) it switches torch.profiler on (CPU activity, plus CUDA when the job uses it),
marks each step with a `gpudiag_step#k` range, and after N steps switches it off again for
good. The trace is written to a private temporary file, summarised and deleted; only the
summary (per-step busy/idle, top kernels and ops, copies by kind and direction with bytes,
the tensor-core share of matrix kernels, each synchronising call with the GPU gap after it,
and at most MAX_EVENTS events for a trace export) goes to the agent, in one datagram.

Imports nothing from gpudiag (the job may run in another environment).
"""

from __future__ import annotations

import bisect
import json
import os
import re
import socket
import sys
import tempfile
import time
from typing import Any

try:
    from . import gpudiag_channel as _channel
except ImportError:  # loaded as a top-level module by sitecustomize
    import gpudiag_channel as _channel

CAPTURE_ENV = _channel.CAPTURE_ENV
REQUEST_SUFFIX = ".capture"  # the agent asks for a capture in a file beside its socket
POLL_S = 0.5  # how often the job looks for that file (one failed open() when absent)
MAX_STEPS = 1000
AFTER_ENV = _channel.AFTER_ENV
DEFAULT_AFTER = 5
TOP = 20
MAX_EVENTS = 500  # events kept for the trace export (the longest ones)
NAME_MAX = 96
STEP_MARK = "gpudiag_step#"
SYNC_CALLS = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
)
MATRIX_RE = re.compile(r"gemm|matmul|mma|cutlass|cublas|conv|sm\d\d_xmma|wgmma", re.I)
TENSOR_CORE_RE = re.compile(
    r"hmma|wmma|xmma|gmma|tensorop|16816|1688|_tf32|bf16|f16|fp16|h884", re.I
)


class _Spans:
    """The union of intervals as disjoint sorted ones, queried by bisection (a capture of a
    big CUDA job holds tens of thousands of kernels: no query may scan them all)."""

    def __init__(self, intervals: list[tuple[float, float]]) -> None:
        starts: list[float] = []
        ends: list[float] = []
        for a, b in sorted(intervals):
            if ends and a <= ends[-1]:
                ends[-1] = max(ends[-1], b)
            else:
                starts.append(a)
                ends.append(b)
        self.starts, self.ends = starts, ends

    def covered(self, lo: float, hi: float) -> float:
        """Length of [lo, hi] the intervals cover."""
        total, i = 0.0, bisect.bisect_right(self.ends, lo)
        while i < len(self.starts) and self.starts[i] < hi:
            total += min(self.ends[i], hi) - max(self.starts[i], lo)
            i += 1
        return total

    def gaps(self, lo: float, hi: float) -> list[tuple[float, float]]:
        """The parts of [lo, hi] the intervals leave uncovered."""
        out, end, i = [], lo, bisect.bisect_right(self.ends, lo)
        while i < len(self.starts) and self.starts[i] < hi:
            if self.starts[i] > end:
                out.append((end, self.starts[i]))
            end = max(end, self.ends[i])
            i += 1
        if end < hi:
            out.append((end, hi))
        return out


def _short(name: str) -> str:
    return name if len(name) <= NAME_MAX else name[: NAME_MAX - 3] + "..."


def _top(events: list[dict]) -> list[dict]:
    acc: dict[str, list[float]] = {}
    for e in events:
        a = acc.setdefault(e["name"], [0.0, 0])
        a[0] += e.get("dur", 0.0)
        a[1] += 1
    rows = sorted(acc.items(), key=lambda kv: -kv[1][0])[:TOP]
    return [{"name": _short(n), "time_s": round(t / 1e6, 6), "calls": c} for n, (t, c) in rows]


def summarise(trace: dict, marks: list[float]) -> dict:
    """The capture's summary from a Chrome trace the profiler exported, and the step
    boundaries (perf_counter) the hooks saw."""
    evs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    by_cat: dict[str, list[dict]] = {}
    for e in evs:
        by_cat.setdefault(e.get("cat", ""), []).append(e)
    steps = sorted(
        (e for e in by_cat.get("user_annotation", []) if e["name"].startswith(STEP_MARK)),
        key=lambda e: e["ts"],
    )
    kernels = by_cat.get("kernel", [])
    gpu = kernels + by_cat.get("gpu_memcpy", []) + by_cat.get("gpu_memset", [])
    loop_tid = steps[0].get("tid") if steps else None
    ops = [e for e in by_cat.get("cpu_op", []) if loop_tid is None or e.get("tid") == loop_tid]
    t0 = steps[0]["ts"] if steps else min((e["ts"] for e in evs), default=0.0)
    busy_src = _Spans([(e["ts"], e["ts"] + e.get("dur", 0.0)) for e in (gpu if gpu else ops)])
    rows, idle_by, over = _steps(steps, marks, busy_src, _host_spans(by_cat), t0)
    matrix = [e for e in kernels if MATRIX_RE.search(e["name"])]
    mt = sum(e.get("dur", 0.0) for e in matrix)
    tc = sum(e.get("dur", 0.0) for e in matrix if TENSOR_CORE_RE.search(e["name"]))
    kept = sorted(ops + gpu, key=lambda e: -e.get("dur", 0.0))[:MAX_EVENTS]
    return {
        "device": "cuda" if gpu else "cpu",
        "steps": rows,
        "window_s": round(sum(r["dur_s"] for r in rows), 6),
        "top_ops": _top(ops),
        "top_kernels": _top(kernels),
        "copies": _copies(by_cat.get("gpu_memcpy", [])),
        "syncs": _syncs(by_cat.get("cuda_runtime", []), sorted(e["ts"] for e in gpu)),
        "tensor_core_share": round(tc / mt, 4) if mt > 0 else None,
        # the idle gaps by what the loop thread was in: DataLoader, a sync, a kernel launch,
        # or none of those (Python, the job's own code)
        "idle_by_host_s": {k: round(v / 1e6, 6) for k, v in idle_by.items()},
        # how much longer the profiler's marked steps ran than the hooks timed them (a busy
        # box delays the marks): by that much the idle split can exceed the steps' idle_s
        "marks_over_steps_s": round(over / 1e6, 6),
        "events": _events(kept, t0),
    }


def _host_spans(by_cat: dict[str, list[dict]]) -> dict[str, _Spans]:
    """What the loop thread did, by priority, to explain the idle gaps: the DataLoader, a
    synchronising call, a kernel launch."""
    runtime = by_cat.get("cuda_runtime", [])
    host = {
        "data": [
            e
            for e in by_cat.get("user_annotation", [])
            if e["name"].startswith("enumerate(DataLoader)")
        ],
        "sync": [e for e in runtime if e["name"].startswith(SYNC_CALLS)],
        "launch": [e for e in runtime if e["name"].startswith(("cudaLaunch", "cuLaunch"))],
    }
    return {k: _Spans([(e["ts"], e["ts"] + e.get("dur", 0.0)) for e in v]) for k, v in host.items()}


def _steps(
    steps: list[dict], marks: list[float], busy_src: _Spans, spans: dict[str, _Spans], t0: float
) -> tuple[list[dict], dict[str, float], float]:
    """Each step's busy and idle time (the hooks' timing where they have it), the idle gaps
    split by what the loop thread was in (us), and how far the marks outlast the steps (us)."""
    idle_by = {k: 0.0 for k in (*spans, "python", "profiler")}
    over = 0.0
    rows = []
    for i, s in enumerate(steps):
        a, b = s["ts"], s["ts"] + s.get("dur", 0.0)
        dur = (marks[i + 1] - marks[i]) if i + 1 < len(marks) else (b - a) / 1e6
        busy = min(dur, busy_src.covered(a, b) / 1e6)
        for x, y in busy_src.gaps(a, b):
            left = y - x
            for k, iv in spans.items():
                got = min(left, iv.covered(x, y))
                idle_by[k] += got
                left -= got
            idle_by["python"] += left
        # the step as the hooks time it, less its marked range: switching the profiler on
        # (first step) and the marks themselves
        idle_by["profiler"] += max(0.0, dur * 1e6 - (b - a))
        over += max(0.0, (b - a) - dur * 1e6)  # the marked range outlasting the step
        rows.append(
            {
                "start_s": round((a - t0) / 1e6, 6),
                "dur_s": round(dur, 6),
                "busy_s": round(busy, 6),
                "idle_s": round(max(0.0, dur - busy), 6),
            }
        )
    return rows, idle_by, over


def _copies(memcpy: list[dict]) -> list[dict]:
    """The copies by kind (pinned, pageable, device) and direction: count, bytes, time."""
    copies: dict[tuple[str, str], list[float]] = {}
    for e in memcpy:
        m = re.search(r"Memcpy (\w+) \((\w+) -> (\w+)\)", e["name"])
        direction = m.group(1) if m else e["name"]
        src = (m.group(2) if m and m.group(1) == "HtoD" else m.group(3) if m else "").lower()
        kind = src if src in ("pinned", "pageable") else "device"
        c = copies.setdefault((kind, direction), [0, 0.0, 0.0])
        c[0] += 1
        c[1] += float((e.get("args") or {}).get("bytes", 0) or 0)
        c[2] += e.get("dur", 0.0)
    return [
        {"kind": k, "direction": d, "count": n, "bytes": int(b), "time_s": round(t / 1e6, 6)}
        for (k, d), (n, b, t) in sorted(copies.items())
    ]


def _syncs(runtime: list[dict], gpu_starts: list[float]) -> list[dict]:
    """Each synchronising call: how often, how long, and the GPU's idle gap after it."""
    syncs: dict[str, list[float]] = {}
    for e in runtime:
        if not e["name"].startswith(SYNC_CALLS):
            continue
        end = e["ts"] + e.get("dur", 0.0)
        j = bisect.bisect_left(gpu_starts, end)
        nxt = gpu_starts[j] if j < len(gpu_starts) else None
        sy = syncs.setdefault(e["name"], [0, 0.0, 0.0])
        sy[0] += 1
        sy[1] += e.get("dur", 0.0)
        sy[2] += (nxt - end) if nxt is not None else 0.0
    return [
        {
            "name": n,
            "count": c,
            "time_s": round(t / 1e6, 6),
            "gpu_gap_after_s": round(g / 1e6, 6),
        }
        for n, (c, t, g) in sorted(syncs.items())
    ]


def _events(kept: list[dict], t0: float) -> list[dict]:
    """The events kept for a trace export, in time order, on their lanes."""
    lane = {"cpu_op": "CPU ops (loop thread)", "kernel": "GPU kernels"}
    return [
        {
            "name": _short(e["name"]),
            "lane": lane.get(e.get("cat", ""), "GPU copies"),
            "ts": round((e["ts"] - t0) / 1e6, 6),
            "dur": round(e.get("dur", 0.0) / 1e6, 6),
        }
        for e in sorted(kept, key=lambda e: e["ts"])
    ]


class Capture:
    """Switches the profiler on after `after` steps, off after `steps` more, then sends."""

    def __init__(
        self, torch: Any, channel: str | None, steps: int, after: int = DEFAULT_AFTER
    ) -> None:
        self.torch = torch
        self.channel = channel
        self.steps = steps
        self.after = after
        self.seen = 0
        self.prof: Any = None  # torch.profiler.profile, while capturing
        self.mark: Any = None  # the open record_function of the step
        self.marks: list[float] = []
        self.t0_wall = 0.0
        self.start_cost = 0.0
        self.done = False
        self.summary: dict | None = None

    def on_step(self) -> None:
        """Called after every optimizer step. Never raises: a failing capture is given up
        (profiler off, one line on stderr) and the job goes on."""
        if self.done:
            return
        try:
            self._step()
        except Exception as exc:
            self.done = True
            self.summary = None
            try:
                if self.prof is not None:
                    self.prof.stop()
            except Exception:
                pass
            self.prof = None
            print(f"gpudiag: profiler capture given up: {exc}", file=sys.stderr)

    def _step(self) -> None:
        self.seen += 1
        if self.prof is None:
            if self.seen >= self.after:
                self._start()
            return
        self.marks.append(time.perf_counter())
        self.mark.__exit__(None, None, None)
        if len(self.marks) > self.steps:
            self._stop()
        else:
            self._open_mark()

    def _open_mark(self) -> None:
        rf = self.torch.autograd.profiler.record_function
        self.mark = rf(f"{STEP_MARK}{len(self.marks)}")
        self.mark.__enter__()

    def _start(self) -> None:
        tp = self.torch.profiler
        acts = [tp.ProfilerActivity.CPU]
        if self.torch.cuda.is_available() and self.torch.cuda.is_initialized():
            acts.append(tp.ProfilerActivity.CUDA)
        # the first step counts from here, as the hooks' step does: it carries the start
        self.marks = [time.perf_counter()]
        self.t0_wall = time.time()
        self.prof = tp.profile(activities=acts)
        self.prof.start()
        self.start_cost = time.perf_counter() - self.marks[0]
        self._open_mark()

    def _stop(self) -> None:
        self.done = True
        t_stop = time.perf_counter()
        self.prof.stop()
        fd, path = tempfile.mkstemp(prefix="gpudiag-capture-", suffix=".json")
        os.close(fd)
        try:
            self.prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        finally:
            os.unlink(path)
        self.prof = None
        summary = summarise(trace, self.marks)
        summary["t0"] = self.t0_wall
        # switching on and off, exporting and summarising: time the job's steps lost
        summary["cost_s"] = round(self.start_cost + time.perf_counter() - t_stop, 6)
        self.summary = summary
        self._send(summary)

    def _send(self, summary: dict) -> bool:
        path = self.channel
        if not path or not _channel.private_path(path):
            return False  # none, or someone else's folder: the summary stays in the job
        msg = {"v": 2, "pid": os.getpid(), "width": 9, "capture": summary}
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(1 << 20, 2 * len(data)))
            sock.settimeout(1.0)  # one datagram, once: wait a little for room, never longer
            sock.sendto(data, path)
            return True
        except OSError as exc:
            print(f"gpudiag: profiler capture not sent: {exc}", file=sys.stderr)
            return False
        finally:
            sock.close()


class Watcher:
    """Per optimizer step: drives the capture asked for at start (GPUDIAG_CAPTURE_STEPS) or
    later, by the agent writing a step count to `<socket>.capture` (`gpudiag attach`, the TUI's
    `c` key); one capture at a time."""

    def __init__(self, torch: Any, channel: str | None) -> None:
        self.torch = torch
        self.channel = channel
        self.request = (channel + REQUEST_SUFFIX) if channel else None
        self.capture = from_env(torch, channel)
        self.next_poll = 0.0
        self.captures: list[dict] = []

    def capturing(self) -> bool:
        """Whether a capture is asked for or running (other step hooks keep out of it)."""
        return self.capture is not None and not self.capture.done

    def on_step(self) -> None:
        """Called after every optimizer step; a few hundred ns when nothing is asked for."""
        cap = self.capture
        if cap is not None and not cap.done:
            cap.on_step()
            if cap.done and cap.summary is not None:
                self.captures.append(cap.summary)
            return
        if self.request is None:
            return
        now = time.perf_counter()
        if now < self.next_poll:
            return
        self.next_poll = now + POLL_S
        text = _channel.read_request(self.request)  # only from a private folder
        if text is None:
            return
        try:
            n = int(text.strip())
        except ValueError:
            return
        if 1 <= n <= MAX_STEPS:
            self.capture = Capture(self.torch, self.channel, n, after=1)


def from_env(torch: Any, channel: str | None) -> Capture | None:
    """A Capture when GPUDIAG_CAPTURE_STEPS asks for one, else None."""
    try:
        steps = int(os.environ.get(CAPTURE_ENV, "0") or 0)
        after = int(os.environ.get(AFTER_ENV, str(DEFAULT_AFTER)) or DEFAULT_AFTER)
    except ValueError:
        return None
    if steps <= 0:
        return None
    return Capture(torch, channel, steps, max(1, after))
