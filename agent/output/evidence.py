"""The report's views for people to look at: the run over time, the loop thread's stacks and
the bounded profiler capture (each optional and bounded in size), and what the capture says
about the findings."""

from __future__ import annotations

from typing import Any

from gpudiag.analyzers.engine.registry import CAPTURE
from gpudiag.analyzers.measures.capture import CaptureSeen, capture_of
from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.analyzers.measures.series import loop_stacks, run_series
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Timeline


def add_evidence_views(
    doc: dict,
    tl: Timeline | None,
    rules: tuple = (),
    thread: Any = None,
    th: Thresholds | None = None,
) -> dict:
    """Add `series`, `stacks` and `capture` to a report from a session's timeline (keys whose
    data the run lacks are left out); the capture's evidence goes into the findings it
    confirms or refutes. Returns the document."""
    if tl is None or tl.origin_ns is None:
        return doc
    clf = Classifier(tuple(rules))
    doc["series"] = run_series(tl, clf, thread)
    stacks = loop_stacks(tl, clf, thread)
    if stacks["stacks"]:
        doc["stacks"] = stacks
    cap = capture_of(tl)
    if cap is not None:
        idle = (doc.get("critical_path") or {}).get("gpu_idle")
        checked = CAPTURE.run(CaptureSeen(doc["findings"], cap, idle, th or Thresholds()))
        doc["findings"] = checked.findings
        doc["capture"] = checked.part
    return doc
