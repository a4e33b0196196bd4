"""Money figures: per finding, idle spend (COST001), right-sizing, --price, no GPU."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.cost.prices import Price, row_of
from tests.analyzers.scenario import Scenario
from tests.analyzers.test_gpu_findings import ME, STARVED, timeline
from tests.probes.fake_nvml import FakeGpu, const

QUARTER_BUSY_9GIB = FakeGpu(job_pids=[ME], util=const(25), job_mem=const(9 * 2**30))


def test_quarter_busy_h100_with_9_gib_costs_money_at_the_dated_reference_price():
    a = analyze(timeline(QUARTER_BUSY_9GIB).tl)
    cost = a.cost
    row = row_of("H100-SXM")
    assert row is not None
    assert cost["available"] and cost["price"]["usd_per_gpu_hour"] == row.usd_per_gpu_hour
    assert cost["price"]["date"] == row.date and cost["price"]["row"]["url"] == row.url
    assert f"built-in reference ({row.date})" in cost["price"]["source"]
    f = next(f for f in a.findings if f.id == "COST001")
    daily_idle = row.usd_per_gpu_hour * 24 * 0.75
    assert f.cost["usd_per_day"] == pytest.approx(daily_idle, abs=0.01)
    assert f"${daily_idle:,.0f}" in f.message
    # no GPM counters in this fake: the bound is not measured, so no model is projected
    rs = a.right_size
    assert not rs["available"] and rs["kind"] == "model" and "rows" not in rs
    assert any("gpm_tensor_active" in m for m in rs["missing"])
    assert rs["host_share"] == pytest.approx(0.75, abs=0.01)
    assert not any("right-size" in a_ for a_ in f.recommendation.actions)


def test_price_override_changes_every_money_figure_consistently():
    tl = timeline(QUARTER_BUSY_9GIB).tl
    base = analyze(tl)
    twice = 2 * base.cost["price"]["usd_per_gpu_hour"]
    dear = analyze(tl, price=Price(twice, "--price"))
    assert dear.cost["price"] == {"usd_per_gpu_hour": twice, "source": "--price", "model": None}
    assert base.cost["price"]["date"] and "date" not in dear.cost["price"]
    assert dear.cost["usd_per_day"] == pytest.approx(2 * base.cost["usd_per_day"], rel=1e-3)
    assert dear.cost["idle"]["usd_per_day"] == pytest.approx(
        2 * base.cost["idle"]["usd_per_day"], rel=1e-3
    )
    for f_base, f_dear in zip(base.findings, dear.findings, strict=True):
        if f_base.cost:
            assert f_dear.cost["usd_per_day"] == pytest.approx(
                2 * f_base.cost["usd_per_day"], rel=1e-2
            )


def test_findings_carry_their_cost_and_the_fixed_scenario_is_cheaper():
    a = analyze(timeline(FakeGpu(job_pids=[ME], util=const(25)), shares=STARVED).tl)
    data = next(f for f in a.findings if f.id == "DATA001")
    price = a.cost["price"]["usd_per_gpu_hour"]
    assert data.cost["usd_per_hour"] == pytest.approx(price * data.impact, rel=1e-3)
    fixed = a.cost["if_fixed"]
    assert fixed["findings"][0] == "DATA001"
    assert fixed["idle"]["usd_per_day"] < a.cost["idle"]["usd_per_day"]


def test_healthy_busy_job_gets_no_cost001():
    a = analyze(timeline(FakeGpu(job_pids=[ME])).tl)
    assert "COST001" not in [f.id for f in a.findings]
    assert a.cost["available"] and a.cost["idle"]["usd_per_day"] < 30


def test_no_gpu_shows_no_money_and_says_why():
    sc = Scenario()
    for _ in range(5):
        sc.window(STARVED)
    a = analyze(sc.tl, price=Price(10.0, "--price"))
    assert a.cost == {
        "available": False,
        "reason": "no GPU used by the job: there is no GPU time to price",
    }
    assert all(f.cost is None for f in a.findings)


def test_unknown_gpu_without_a_price_says_how_to_give_one():
    a = analyze(timeline(FakeGpu(name="Mystery Accelerator", job_pids=[ME], util=const(20))).tl)
    assert not a.cost["available"] and "--price" in a.cost["reason"]
    a = analyze(
        timeline(FakeGpu(name="Mystery Accelerator", job_pids=[ME], util=const(20))).tl,
        price_table={"default": 2.0},
    )
    assert a.cost["price"]["usd_per_gpu_hour"] == 2.0


def test_regular_checkpoints_make_spot_an_option():
    shares = {"checkpoint": 0.2, "forward": 0.4, "backward": 0.4}
    a = analyze(timeline(QUARTER_BUSY_9GIB, shares=shares).tl)
    assert a.cost["spot"]["applicable"] and "60-90%" in a.cost["spot"]["note"]
