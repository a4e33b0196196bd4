"""The capture gpudiag takes by itself: once per session, when the top GPU finding rests on
NVML alone (utilisation or GPM counters, no stack or hook signal), it asks the job's hooks for
a profiler capture so the report can confirm or refute that finding with kernel times."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpudiag.analyzers.model.catalogue import category

if TYPE_CHECKING:
    from gpudiag.analyzers import Analysis

AUTO_CAPTURE_STEPS = 10
CHECK_EVERY_S = 15.0  # how often the session looks (one analysis of the timeline so far)
FIRST_CHECK_S = 20.0  # not before the loop has had time to show its verdict


def nvml_only_verdict(analysis: Analysis) -> str | None:
    """The top warning or error finding's id when it is a GPU finding whose signals are all
    NVML's; None otherwise."""
    from gpudiag.analyzers.engine.catalogue_doc import catalogue

    catalogue()  # every finding unit's spec registered (no analysis may have run here)

    top = next((f for f in analysis.findings if f.severity in ("error", "warning")), None)
    if top is None or category(top.id) != "gpu" or not top.signals:
        return None
    return top.id if all(s.startswith("nvml") for s in top.signals) else None


class AutoCapture:
    """Called every session tick; asks for at most one capture per session."""

    def __init__(self, session: Any, clock: Any = time.monotonic) -> None:
        self.session = session
        self.clock = clock
        self.next_check = clock() + FIRST_CHECK_S
        self.done = False

    def tick(self) -> str | None:
        """Check when due; the line logged when a capture was asked for, else None."""
        asked = self.session.capture_steps  # attach --capture-steps N
        if asked:
            hooks = next((p for p in self.session.probes if p.captures), None)
            if hooks is not None and getattr(hooks, "messages", None):
                self.session.capture_steps = None
                self.done = True  # the one capture of this session
                line = self.session.request_capture(asked)
                self.session.log(line)
                return line
        if self.done or self.clock() < self.next_check:
            return None
        self.next_check = self.clock() + CHECK_EVERY_S
        gpu = self.session.statuses.get("gpu")
        if gpu is None or not gpu.available:
            return None  # no NVML verdict to check: do not spend an analysis on it
        hooks = next((p for p in self.session.probes if p.captures), None)
        if hooks is None or not getattr(hooks, "messages", None):
            return None  # no hooks, or the job has not reported a step yet
        fid = nvml_only_verdict(self.session.snapshot())
        if fid is None:
            return None
        self.done = True
        line = f"{fid} rests on NVML alone: {self.session.request_capture(AUTO_CAPTURE_STEPS)}"
        self.session.log(line)
        return line
