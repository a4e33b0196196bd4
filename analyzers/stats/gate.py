"""Regression decisions for the CI gate: median ratio, bootstrap confidence interval, budgets.

For each metric, the current runs are compared with the baseline runs: the point estimate
is median(current) / median(baseline); its 95% confidence interval comes from a percentile
bootstrap (resampling both sides with replacement, a fixed seed so the same inputs give the
same verdict). A change counts only when it is larger than the minimum effect size, and the
verdict is "inconclusive" when the interval straddles the fail limit or there are too few
runs (or when the median change is past the warning limit and its interval reaches the
fail limit). Absolute budgets (e.g. data-wait share under 10%) use the interval of the current
median alone.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass
from typing import Literal

Direction = Literal["higher", "lower"]
Verdict = Literal["pass", "warn", "fail", "inconclusive", "skipped"]

# What gpudiag knows about each metric's good direction.
DIRECTIONS: dict[str, Direction] = {
    "steps_per_second": "higher",
    "samples_per_second": "higher",
    "step_time_p50_s": "lower",
    "step_time_p95_s": "lower",
    "data_wait_ratio": "lower",
    "cuda_peak_bytes": "lower",
    "gpu_busy": "higher",
    "gpu_sm_active": "higher",
    "sync_time_ratio": "lower",
}


@dataclass(frozen=True)
class Limit:
    """warn/fail limits of one metric: relative (fraction of baseline) or absolute budgets."""

    metric: str
    direction: Direction
    warn: float | None = 0.05
    fail: float | None = 0.10
    relative: bool = True
    level: Literal["off", "warn", "error"] = "error"


@dataclass(frozen=True)
class Comparison:
    """One metric's verdict with everything a reader needs to check it."""

    metric: str
    verdict: Verdict
    baseline: float | None
    current: float | None
    delta: float | None  # relative change (+ = higher), or absolute for budgets
    ci_low: float | None
    ci_high: float | None
    n_baseline: int
    n_current: int
    limit: float | None
    reason: str

    def to_dict(self) -> dict:
        """JSON form."""
        return asdict(self)


def bootstrap_ratio_ci(
    base: list[float],
    cur: list[float],
    resamples: int = 2000,
    seed: int = 1234,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(cur) / median(base)."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        b = statistics.median(rng.choices(base, k=len(base)))
        c = statistics.median(rng.choices(cur, k=len(cur)))
        if b != 0:
            ratios.append(c / b)
    ratios.sort()
    lo = ratios[int((1 - level) / 2 * (len(ratios) - 1))]
    hi = ratios[int((1 + level) / 2 * (len(ratios) - 1))]
    return lo, hi


def bootstrap_median_ci(
    values: list[float], resamples: int = 2000, seed: int = 1234, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return (
        meds[int((1 - level) / 2 * (len(meds) - 1))],
        meds[int((1 + level) / 2 * (len(meds) - 1))],
    )


def compare(
    limit: Limit, base: list[float], cur: list[float], min_effect: float = 0.02, min_runs: int = 3
) -> Comparison:
    """The verdict for one metric (see the module docstring)."""
    base = [v for v in base if v is not None]
    cur = [v for v in cur if v is not None]
    if limit.level == "off":
        return Comparison(
            limit.metric,
            "skipped",
            None,
            None,
            None,
            None,
            None,
            len(base),
            len(cur),
            None,
            "level off",
        )
    if not cur or (limit.relative and not base):
        return Comparison(
            limit.metric,
            "skipped",
            _med(base),
            _med(cur),
            None,
            None,
            None,
            len(base),
            len(cur),
            None,
            "metric not measured",
        )
    worse_sign = -1.0 if limit.direction == "higher" else 1.0
    if not limit.relative:
        return _compare_absolute(limit, cur, min_runs, worse_sign)
    return _compare_relative(limit, base, cur, min_effect, min_runs, worse_sign)


def _compare_absolute(
    limit: Limit, cur: list[float], min_runs: int, worse_sign: float
) -> Comparison:
    """An absolute budget: the current runs' median and its interval against the limits."""
    lo, hi = bootstrap_median_ci(cur) if len(cur) > 1 else (cur[0], cur[0])
    value = statistics.median(cur)
    fail, warn = limit.fail, limit.warn

    def beyond(x: float, lim: float | None) -> bool:
        return lim is not None and (x > lim if worse_sign > 0 else x < lim)

    verdict: Verdict
    if len(cur) < min_runs and beyond(value, fail):
        verdict, reason = "inconclusive", f"{len(cur)} runs, {min_runs} needed"
    elif beyond(lo if worse_sign > 0 else hi, fail):
        verdict, reason = "fail", "whole interval beyond the budget"
    elif beyond(value, fail):
        verdict, reason = "inconclusive", "interval straddles the budget"
    elif beyond(value, warn):
        verdict, reason = "warn", "median beyond the warning budget"
    else:
        verdict, reason = "pass", "within budget"
    if verdict == "fail" and limit.level == "warn":
        verdict = "warn"
    return Comparison(limit.metric, verdict, None, value, value, lo, hi, 0, len(cur), fail, reason)


def _compare_relative(
    limit: Limit,
    base: list[float],
    cur: list[float],
    min_effect: float,
    min_runs: int,
    worse_sign: float,
) -> Comparison:
    """A relative limit: the ratio of the medians, current over baseline, and its interval."""
    b, c = statistics.median(base), statistics.median(cur)
    ratio = c / b if b else float("inf")
    delta = ratio - 1.0
    if len(base) + len(cur) < min_runs or len(cur) < 2:
        lo = hi = ratio
        enough = False
    else:
        lo, hi = bootstrap_ratio_ci(base, cur)
        enough = True
    lo_d, hi_d = lo - 1.0, hi - 1.0
    worst = hi_d if worse_sign > 0 else lo_d  # the end of the interval on the bad side
    best = lo_d if worse_sign > 0 else hi_d
    fail, warn = limit.fail, limit.warn

    def worse_than(d: float, lim: float | None) -> bool:
        return lim is not None and d * worse_sign > max(lim, min_effect)

    verdict: Verdict
    if worse_than(best, fail) and enough:
        verdict, reason = "fail", "whole interval worse than the fail limit"
    elif worse_than(delta, fail):
        verdict, reason = (
            "inconclusive",
            ("too few runs" if not enough else "interval straddles the fail limit"),
        )
    elif not enough and worse_than(worst, fail):
        verdict, reason = "inconclusive", "too few runs"
    elif worse_than(worst, fail) and worse_than(delta, warn):
        # past the warning limit, with the interval reaching the fail limit
        verdict, reason = "inconclusive", "interval straddles the fail limit"
    elif worse_than(delta, warn):
        verdict, reason = "warn", "median change beyond the warning limit"
    else:
        verdict, reason = "pass", "within limits"
    if verdict == "fail" and limit.level == "warn":
        verdict = "warn"
    return Comparison(
        limit.metric, verdict, b, c, delta, lo_d, hi_d, len(base), len(cur), fail, reason
    )


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def overall(comparisons: list[Comparison]) -> Verdict:
    """fail beats inconclusive beats warn beats pass."""
    verdicts = {c.verdict for c in comparisons}
    for v in ("fail", "inconclusive", "warn"):
        if v in verdicts:
            return v
    return "pass"
