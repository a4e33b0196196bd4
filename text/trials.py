"""The fix trials (`gpudiag try`) as text: a line per trial, the summary's block."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def summary_line(trial: Mapping[str, Any]) -> str:
    """One line per trial for the text summary."""
    fix = trial["fix"]
    values = ", ".join(f"{k}={v}" for k, v in (fix.get("values") or {}).items())
    kind = f"{fix.get('kind')} {fix['target']}" if fix.get("target") else fix.get("kind")
    head = f"{trial.get('finding') or 'fix'} {kind}({values})"
    if trial["measured"] is None:
        return f"{head}: {trial['verdict']}: {trial['reason']}"
    lo, hi = trial["interval"]
    low = trial.get("predicted_low")
    pred = (
        f", predicted x{low:.2f}-x{trial['predicted']:.2f}"
        if low and trial.get("predicted") and low < trial["predicted"]
        else (f", predicted x{trial['predicted']:.2f}" if trial.get("predicted") else "")
    )
    return (
        f"{head}: x{trial['measured']:.2f} [{lo:.2f}, {hi:.2f}] over {trial['rounds']} rounds"
        f"{pred}: {trial['verdict']}"
    )


def trial_lines(doc: Mapping[str, Any]) -> list[str]:
    """The report's `trials` for the text summary and the HTML page (empty without them)."""
    trials = doc.get("trials") or []
    if not trials:
        return []
    out = ["", f"Fix trials ({len(trials)}, gpudiag try: fixed / as-is step rate):"]
    for t in trials:
        out.append(f"  {summary_line(t)}")
        if t.get("reason"):
            out.append(f"    {t['reason']}")
        if t.get("timed_over"):
            out.append(f"    timed over {t['timed_over']}")
        if t.get("change"):
            out.append(f"    change: {t['change']}")
    return out


def with_trials(doc: Mapping[str, Any]) -> list[dict]:
    """The findings, each with its trial (when one tried its fix) under `trial`."""
    by_id = {t.get("finding"): t for t in doc.get("trials") or [] if t.get("finding")}
    return [{**f, "trial": by_id[f["id"]]} if f["id"] in by_id else f for f in doc["findings"]]
