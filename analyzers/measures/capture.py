"""The bounded profiler capture's summary, as the job's hooks sent it (one sample whose
`summary` label holds the JSON the job made), checked and bounded for the report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpudiag.analyzers.model.catalogue import explains_gpu_idle
from gpudiag.analyzers.model.results import Passed
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Aggregate, Timeline

MAX_ROWS = 50  # top ops, kernels, copies, syncs kept
MAX_EVENTS = 4096  # events kept for the trace export
KEYS = ("top_ops", "top_kernels", "copies", "syncs")


@dataclass(frozen=True)
class CaptureSeen:
    """The `capture` pass's input: a report's findings, the capture (`capture_of`), and the
    GPU idle share of the loop the findings were decided on."""

    findings: list[dict]
    capture: dict
    gpu_idle: float | None
    th: Thresholds


def capture_findings(seen: CaptureSeen) -> Passed[dict]:
    """The report's findings with the capture's evidence in those it confirms or refutes; the
    part is the capture with its checks."""
    checks, evidence = capture_checks(seen.findings, seen.capture, seen.gpu_idle, seen.th)
    findings = [
        dict(f, evidence=list(f["evidence"]) + evidence.get(f["id"], [])) for f in seen.findings
    ]
    return Passed(findings, dict(seen.capture, checks=checks))


def _num(v: Any) -> float | None:
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
        if (v := _num(raw.get(k))) is not None:
            out[k] = max(0.0, v)
    idle_by = raw.get("idle_by_host_s")
    if isinstance(idle_by, dict):
        out["idle_by_host_s"] = {
            str(k): max(0.0, float(v)) for k, v in idle_by.items() if _num(v) is not None
        }
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


def _ev(metric: str, value: float, unit: str, **kw: Any) -> dict:
    return {"metric": metric, "value": round(value, 6), "unit": unit, "source": "capture", **kw}


def capture_checks(
    findings: list[dict], cap: dict, gpu_idle: float | None, th: Thresholds
) -> tuple[list[dict], dict[str, list[dict]]]:
    """What the capture says about each finding it bears on: (checks, evidence by finding
    id). A check is {finding, confirms, statement}; only CUDA captures test GPU findings."""
    steps = cap.get("steps") or []
    total = sum(s["dur_s"] for s in steps)
    if cap.get("device") != "cuda" or total <= 0:
        return [], {}
    idle = sum(s.get("idle_s") or 0.0 for s in steps) / total
    checks: list[dict] = []
    evidence: dict[str, list[dict]] = {}
    for f in findings:
        fid = f["id"]
        ev: list[dict] = []
        verdict: bool | None = None
        why = ""
        if explains_gpu_idle(fid) and gpu_idle:
            need = th.capture_idle_confirm * gpu_idle
            verdict = idle >= need
            ev.append(
                _ev(
                    "capture_gpu_idle_share",
                    idle,
                    "ratio",
                    threshold=round(need, 6),
                    comparison=">=",
                    setting="capture_idle_confirm",
                )
            )
            why = f"the GPU idled {idle:.0%} of the {len(steps)} captured steps"
        if fid == "XFER001":
            pageable = sum(
                c.get("bytes", 0)
                for c in cap.get("copies", [])
                if c.get("kind") == "pageable" and c.get("direction") == "HtoD"
            )
            ev.append(_ev("capture_pageable_h2d_bytes", float(pageable), "bytes"))
            verdict = bool(pageable) if verdict is None else (verdict and bool(pageable))
            why += f"; {pageable / 2**20:.0f} MiB copied from pageable memory"
        if fid == "GPU003" and cap.get("tensor_core_share") is not None:
            share = cap["tensor_core_share"]
            ev.append(
                _ev(
                    "capture_tensor_core_share",
                    share,
                    "ratio",
                    threshold=th.capture_tensor_core_min,
                    comparison="<",
                    setting="capture_tensor_core_min",
                )
            )
            verdict = share < th.capture_tensor_core_min
            why = f"{share:.0%} of matrix-kernel time ran on tensor cores"
        if fid == "SYNC001" and cap.get("syncs"):
            n = sum(s.get("count", 0) for s in cap["syncs"])
            gap = sum(s.get("gpu_gap_after_s", 0.0) for s in cap["syncs"])
            ev.append(_ev("capture_syncs_per_step", n / len(steps), "count"))
            ev.append(_ev("capture_gpu_gap_after_syncs_s", gap, "s"))
            why += f"; {n} syncs left the GPU idle {gap * 1000:.1f} ms in all"
        if verdict is None:
            continue
        evidence[fid] = ev
        word = "confirms" if verdict else "does not confirm"
        checks.append(
            {
                "finding": fid,
                "confirms": verdict,
                "statement": f"the capture {word} {fid}: {why.strip('; ')}",
            }
        )
    return checks, evidence
