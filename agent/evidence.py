"""The report's views for people to look at: the run over time, the loop thread's stacks and
the bounded profiler capture (each optional and bounded in size)."""

from __future__ import annotations

from gpudiag.analyzers.capture import capture_of
from gpudiag.analyzers.rules import Classifier
from gpudiag.analyzers.series import loop_stacks, run_series
from gpudiag.analyzers.timeline import Timeline


def evidence_views(tl: Timeline | None, rules: tuple = (), thread=None) -> dict:
    """`series`, `stacks` and `capture` of a report, from a session's timeline; keys whose
    data the run lacks are left out."""
    if tl is None or tl.origin_ns is None:
        return {}
    clf = Classifier(tuple(rules))
    out: dict = {"series": run_series(tl, clf, thread)}
    stacks = loop_stacks(tl, clf, thread)
    if stacks["stacks"]:
        out["stacks"] = stacks
    cap = capture_of(tl)
    if cap is not None:
        out["capture"] = cap
    return out
