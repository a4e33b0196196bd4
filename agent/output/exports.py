"""Exports other tools open, made from a report (so small by construction: every view they
draw from is bounded in the report).

* speedscope JSON (https://www.speedscope.app): the loop thread's stacks as a sampled
  profile, one sample per distinct stack weighted by its count.
* Chrome/Perfetto JSON trace (chrome://tracing, ui.perfetto.dev): the run's phases, the
  loop thread's phases per stack window, GPU utilisation and steps/s as counters, and the
  profiler capture's steps and ops when the report has one.
"""

from __future__ import annotations

import math
from typing import Any

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import WriteError, atomic_write, dumps_json

SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"
RUN_PID, CAPTURE_PID = 1, 2


def _frame(text: str) -> dict:
    lpar = text.rfind(" (")
    if lpar < 0 or not text.endswith(")"):
        return {"name": text}
    file, _, line = text[lpar + 2 : -1].rpartition(":")
    out: dict = {"name": text[:lpar]}
    if file:
        out["file"] = file
    if line.isdigit():
        out["line"] = int(line)
    return out


def speedscope_of(doc: dict) -> dict:
    """The report's loop-thread stacks as a speedscope file (sampled profile, unit: samples)."""
    st = doc.get("stacks") or {}
    rows = st.get("stacks") or []
    if not rows:
        raise UsageError("the report has no stacks of the loop thread to export")
    total = sum(float(r["count"]) for r in rows)
    name = f"gpudiag: loop thread {st.get('thread') or ''}".strip()
    return {
        "$schema": SPEEDSCOPE_SCHEMA,
        "name": name,
        "exporter": "gpudiag",
        "activeProfileIndex": 0,
        "shared": {"frames": [_frame(f) for f in st.get("frames", [])]},
        "profiles": [
            {
                "type": "sampled",
                "name": name,
                "unit": "none",
                "startValue": 0,
                "endValue": total,
                "samples": [list(r["frames"]) for r in rows],
                "weights": [float(r["count"]) for r in rows],
            }
        ],
    }


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def _meta(pid: int, tid: int | None, kind: str, name: str) -> dict:
    ev = {"name": kind, "ph": "M", "pid": pid, "tid": tid or 0, "args": {"name": name}}
    return ev


def chrome_trace_of(doc: dict) -> dict:
    """The report's timeline (and capture) as a Chrome JSON trace (times in microseconds
    from the report's first sample)."""
    series = doc.get("series") or {}
    pts = series.get("points") or []
    ev: list[dict] = [
        _meta(RUN_PID, None, "process_name", "gpudiag: the run"),
        _meta(RUN_PID, 1, "thread_name", "run phases"),
        _meta(RUN_PID, 2, "thread_name", f"loop thread {series.get('thread') or ''}".strip()),
    ]
    end = max((p["t_s"] + p["dur_s"] for p in pts), default=0.0)
    lo, hi = series.get("loop_start_s"), series.get("loop_end_s")
    spans = []
    if lo is not None:
        spans = [("start-up", 0.0, lo), ("loop", lo, hi if hi is not None else end)]
        if hi is not None and hi < end:
            spans.append(("shutdown", hi, end))
    for name, a, b in spans:
        if b > a:
            ev.append(_x(name, "run", (RUN_PID, 1), a, b - a))
    prev = 0.0
    for p in pts:
        t1 = p["t_s"] + p["dur_s"]
        if p.get("phases"):
            top = max(p["phases"], key=p["phases"].get)
            ev.append(_x(top, "phases", (RUN_PID, 2), prev, t1 - prev, dict(p["phases"])))
            prev = t1
        if p.get("gpu_util"):
            args = {f"GPU {g}": round(v * 100, 1) for g, v in p["gpu_util"].items()}
            ev.append(_c("GPU utilisation %", p["t_s"], args))
        if p["dur_s"] > 0:
            ev.append(_c("steps/s", p["t_s"], {"steps/s": round(p["steps"] / p["dur_s"], 3)}))
    cap = doc.get("capture")
    if cap and cap.get("steps"):
        ev += _capture_events(cap)
    return {
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": {"tool": "gpudiag", "version": (doc.get("tool") or {}).get("version", "")},
    }


def _x(
    name: str, cat: str, lane: tuple[int, int], start_s: float, dur_s: float, args: Any = None
) -> dict:
    """A complete event on `lane` (its pid and tid)."""
    pid, tid = lane
    ev = {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": _us(start_s),
        "dur": max(0.0, _us(dur_s)),
        "pid": pid,
        "tid": tid,
    }
    if args:
        ev["args"] = args
    return ev


def _c(name: str, t_s: float, args: dict) -> dict:
    return {"name": name, "ph": "C", "ts": _us(t_s), "pid": RUN_PID, "tid": 0, "args": args}


def _number(value: object) -> float | None:
    """A finite number of a report's field, or None (a crafted report may hold anything in a
    field its schema leaves open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def _capture_events(cap: dict) -> list[dict]:
    """The capture's steps and its bounded op events, placed at its start in the run (an
    event without a number for its start is left out)."""
    base = _number(cap.get("start_s_run")) or 0.0
    out = [
        _meta(CAPTURE_PID, None, "process_name", f"profiler capture ({cap.get('device', 'cpu')})"),
        _meta(CAPTURE_PID, 1, "thread_name", "steps"),
    ]
    for i, s in enumerate(cap["steps"]):
        start = base + float(s.get("start_s") or 0.0)
        args = {k: s[k] for k in ("busy_s", "idle_s") if s.get(k) is not None}
        out.append(_x(f"step {i + 1}", "capture", (CAPTURE_PID, 1), start, s["dur_s"], args))
    lanes: dict[str, int] = {}
    for e in cap.get("events", []):
        ts = _number(e.get("ts"))
        if ts is None:
            continue
        lane = str(e.get("lane", "ops"))
        if lane not in lanes:
            lanes[lane] = 2 + len(lanes)
            out.append(_meta(CAPTURE_PID, lanes[lane], "thread_name", lane))
        out.append(
            _x(
                str(e.get("name", "?")),
                lane,
                (CAPTURE_PID, lanes[lane]),
                base + ts,
                _number(e.get("dur")) or 0.0,
            )
        )
    return out


def write_json(obj: dict, path: str, what: str = "export") -> str:
    """Write compact strict JSON atomically and privately; the absolute path written."""
    return atomic_write(path, dumps_json(obj), what=what)


def write_text(text: str, path: str, what: str = "file") -> str:
    """Write text atomically and privately; the absolute path written."""
    return atomic_write(path, text, what=what)


def write_exports(doc: dict, speedscope: str | None, trace: str | None) -> list[str]:
    """Write the exports asked for; lines saying where each went (or why it was not)."""
    lines = []
    if speedscope:
        try:
            where = write_json(speedscope_of(doc), speedscope, "speedscope profile")
            lines.append(f"speedscope profile written to {where}")
        except UsageError as exc:  # no stacks, or a WriteError naming the file
            lines.append(f"no speedscope profile: {exc}")
    if trace:
        try:
            where = write_json(chrome_trace_of(doc), trace, "Chrome/Perfetto trace")
            lines.append(f"Chrome/Perfetto trace written to {where}")
        except WriteError as exc:
            lines.append(f"no Chrome/Perfetto trace: {exc}")
    return lines
