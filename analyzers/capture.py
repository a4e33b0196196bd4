"""The bounded profiler capture's summary, as the job's hooks sent it (one sample whose
`summary` label holds the JSON the job made), checked and bounded for the report."""

from __future__ import annotations

import json

from gpudiag.analyzers.timeline import Aggregate, Timeline

MAX_ROWS = 50  # top ops, kernels, copies, syncs kept
MAX_EVENTS = 4096  # events kept for the trace export
KEYS = ("top_ops", "top_kernels", "copies", "syncs")


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def capture_of(tl: Timeline | Aggregate) -> dict | None:
    """The latest capture summary in the timeline, or None (no capture, or unreadable)."""
    found = tl.matching("hooks", "capture_steps", kind="capture")
    if not found:
        return None
    labels, roll = max(found, key=lambda lr: lr[1].last_ns or 0)
    try:
        raw = json.loads(labels.get("summary", ""))
    except ValueError:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("steps"), list):
        return None
    steps = []
    for s in raw["steps"]:
        if isinstance(s, dict) and _num(s.get("dur_s")) is not None and s["dur_s"] >= 0:
            steps.append({k: _num(s.get(k)) for k in ("start_s", "dur_s", "busy_s", "idle_s")})
            steps[-1] = {k: v for k, v in steps[-1].items() if v is not None or k != "start_s"}
    out: dict = {"device": str(raw.get("device", "cpu")), "steps": steps}
    start = tl.start_ns
    if roll.first_ns is not None and start is not None:
        out["start_s_run"] = round(max(0.0, (roll.first_ns - start) / 1e9), 6)
    for k in ("window_s", "cost_s"):
        if _num(raw.get(k)) is not None:
            out[k] = max(0.0, _num(raw.get(k)))
    share = _num(raw.get("tensor_core_share"))
    out["tensor_core_share"] = None if share is None else min(1.0, max(0.0, share))
    for k in KEYS:
        rows = raw.get(k)
        rows = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
        out[k] = [r for r in rows if k not in ("top_ops", "top_kernels") or _row_ok(r)][:MAX_ROWS]
    ev = raw.get("events")
    out["events"] = (
        [e for e in ev if isinstance(e, dict) and _num(e.get("ts")) is not None][:MAX_EVENTS]
        if isinstance(ev, list)
        else []
    )
    return out


def _row_ok(r: dict) -> bool:
    return isinstance(r.get("name"), str) and _num(r.get("time_s")) is not None
