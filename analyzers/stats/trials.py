"""gpudiag try's verdict: a fix's measured speed-up (fixed / baseline step rate) with its
95% interval (the gate's bootstrap), against the finding's prediction."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.stats.gate import bootstrap_ratio_ci


@dataclass(frozen=True)
class TrialResult:
    """The measured ratio of step rates, its interval and the verdict on the prediction."""

    measured: float | None
    interval: tuple[float, float] | None
    verdict: str  # held, missed, slower, failed, no prediction
    reason: str


def judge(
    base: list[float],
    fixed: list[float],
    predicted: float | None,
    th: Thresholds,
    predicted_low: float | None = None,
    floor: bool = False,
) -> TrialResult:
    """Compare per-round step rates of the two arms.

    slower: the whole interval is under 1; held: the prediction lies in the interval widened
    by `trial_tolerance` (a hypothesis' range, `predicted_low` to `predicted`, meets it; a
    `floor`, the least the fix gives, is met by the interval or anything above it); missed
    otherwise; no prediction when none was made."""
    if not base or not fixed or min(base) <= 0:
        return TrialResult(None, None, "failed", "no steps measured in one of the arms")
    measured = statistics.median(fixed) / statistics.median(base)
    if len(base) > 1 and len(fixed) > 1:
        lo, hi = bootstrap_ratio_ci(base, fixed)
    else:
        lo = hi = measured
    tol = th.trial_tolerance
    where = f"measured x{measured:.2f} [{lo:.2f}, {hi:.2f}]"
    if hi < 1.0:
        return TrialResult(measured, (lo, hi), "slower", f"{where}: the fix slows the job")
    if predicted is None:
        return TrialResult(measured, (lo, hi), "no prediction", f"{where}; nothing predicted")
    low = predicted if predicted_low is None else min(predicted_low, predicted)
    inside = low <= hi * (1 + tol) and (floor or predicted >= lo * (1 - tol))
    verdict = "held" if inside else "missed"
    said = f"x{predicted:.2f}" if low == predicted else f"x{low:.2f}-x{predicted:.2f}"
    said = f"at least {said}" if floor else said
    return TrialResult(
        measured,
        (lo, hi),
        verdict,
        f"{where}, predicted {said}: {'inside' if inside else 'outside'} the "
        f"interval widened by trial_tolerance={tol:g}",
    )
