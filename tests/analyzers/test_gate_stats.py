"""The gate's decision on synthetic distributions: clear pass, clear fail, straddling, few runs."""

from __future__ import annotations

import random

from gpudiag.analyzers.stats.gate import Limit, bootstrap_ratio_ci, compare, overall

SPS = Limit("steps_per_second", "higher", warn=0.05, fail=0.10)


def noisy(center: float, n: int, spread: float = 0.02, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_same_distribution_passes():
    c = compare(SPS, noisy(10, 5, seed=1), noisy(10, 5, seed=2))
    assert c.verdict == "pass" and abs(c.delta) < 0.03
    assert c.ci_low < 0 < c.ci_high or abs(c.delta) < 0.03


def test_clear_slowdown_fails_with_the_interval_beyond_the_limit():
    c = compare(SPS, noisy(10, 5, seed=1), noisy(7, 5, seed=2))
    assert c.verdict == "fail"
    assert c.delta < -0.25 and c.ci_high < -0.10
    assert (c.n_baseline, c.n_current) == (5, 5)


def test_straddling_the_limit_is_inconclusive():
    base = noisy(10, 5, spread=0.01, seed=1)
    cur = [9.9, 8.3, 9.6, 8.4, 9.0]  # median 10% down, the runs spread across the limit
    c = compare(SPS, base, cur)
    assert c.verdict == "inconclusive" and "straddles" in c.reason


def test_too_few_runs_is_inconclusive_not_a_failure():
    c = compare(SPS, [10.0], [7.0])
    assert c.verdict == "inconclusive" and "too few runs" in c.reason


def test_improvement_is_a_pass_and_direction_matters():
    p50 = Limit("step_time_p50_s", "lower")
    assert compare(p50, noisy(0.1, 5, seed=1), noisy(0.07, 5, seed=2)).verdict == "pass"
    assert compare(p50, noisy(0.1, 5, seed=1), noisy(0.13, 5, seed=2)).verdict == "fail"


def test_small_change_under_the_minimum_effect_passes():
    tight = Limit("steps_per_second", "higher", warn=0.001, fail=0.005)
    c = compare(tight, noisy(10, 8, 0.001, 1), noisy(9.99, 8, 0.001, 2), min_effect=0.02)
    assert c.verdict == "pass"


def test_absolute_budget():
    budget = Limit("data_wait_ratio", "lower", warn=0.05, fail=0.10, relative=False)
    assert compare(budget, [], [0.02, 0.03, 0.025]).verdict == "pass"
    assert compare(budget, [], [0.30, 0.32, 0.31]).verdict == "fail"
    assert compare(budget, [], [0.07, 0.06, 0.08]).verdict == "warn"


def test_level_warn_never_fails_and_off_is_skipped():
    soft = Limit("steps_per_second", "higher", level="warn")
    assert compare(soft, noisy(10, 5, seed=1), noisy(5, 5, seed=2)).verdict == "warn"
    off = Limit("steps_per_second", "higher", level="off")
    assert compare(off, [1.0], [1.0]).verdict == "skipped"


def test_bootstrap_is_deterministic_and_overall_takes_the_worst():
    a, b = noisy(10, 6, seed=3), noisy(9, 6, seed=4)
    assert bootstrap_ratio_ci(a, b) == bootstrap_ratio_ci(a, b)
    cs = [
        compare(SPS, noisy(10, 5), noisy(10, 5, seed=9)),
        compare(SPS, noisy(10, 5), noisy(5, 5, seed=9)),
    ]
    assert overall(cs) == "fail"
