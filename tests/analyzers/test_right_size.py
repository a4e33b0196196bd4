"""Right-sizing from the measured bound (a model) and the dated, sourced price table."""

from __future__ import annotations

import json
from datetime import timedelta
from functools import cache

import pytest

from gpudiag.agent.output.recording import read_recording
from gpudiag.agent.output.render.text import cost_lines
from gpudiag.analyzers import analyze
from gpudiag.analyzers.cost.money import price_age
from gpudiag.analyzers.cost.prices import PRICES, Price, by_key, load_table, row_of, table_text
from gpudiag.analyzers.cost.projection import Bound, ratios, speed_of, unit_rate
from gpudiag.analyzers.timeline.timeline import Timeline
from tests.agent.test_metrics import _families
from tests.analyzers.test_cost import QUARTER_BUSY_9GIB
from tests.analyzers.test_gpu_findings import ME, timeline
from tests.analyzers.test_h100_recordings import FIXTURES, replay
from tests.probes.fake_nvml import FakeGpu

H100 = by_key("H100-SXM")


@cache
def right(name: str) -> dict:
    return replay(name).right_size


def rows(rs: dict) -> dict[str, dict]:
    return {r["model"]: r for r in rs["rows"]}


def test_every_price_row_has_a_source_url_and_date():
    assert PRICES
    for r in PRICES:
        assert r.source and r.url.startswith("https://") and r.date, r
        lo, hi = r.on_demand_usd
        assert lo <= r.usd_per_gpu_hour <= hi, r  # the figure used lies in its range


@pytest.mark.parametrize("field", ["source", "date", "url"])
def test_a_price_row_without_source_or_date_is_rejected(field):
    data = json.loads(table_text())
    data["prices"][0].pop(field)
    with pytest.raises(ValueError, match=field):
        load_table(json.dumps(data))
    data = json.loads(table_text())
    data["prices"][0]["date"] = "late 2026"
    with pytest.raises(ValueError, match="date"):
        load_table(json.dumps(data))


@pytest.mark.parametrize(
    "key,hbm,bf16",
    [("H200", 1.43, 1.0), ("A100-80", 0.61, 0.32), ("L40S", 0.26, 0.37), ("L4", 0.09, 0.12)],
)
def test_datasheet_ratios_against_the_h100(key, hbm, bf16):
    m = by_key(key)
    assert m is not None and H100 is not None
    r = ratios(m, H100)
    assert r["memory"] == pytest.approx(hbm, abs=0.01)
    assert r["tensor"] == pytest.approx(bf16, abs=0.01)


def test_a_price_older_than_a_year_is_flagged_in_the_summary():
    row = row_of("H100-SXM")
    assert row is not None
    price = Price(row.usd_per_gpu_hour, "ref", "H100-SXM", row)
    assert price_age(price, row.day() + timedelta(days=400))["stale"] is True
    assert price_age(price, row.day() + timedelta(days=100))["stale"] is False
    assert price_age(Price(2.0, "--price"), row.day()) == {}  # a user's price has no age
    a = analyze(timeline(QUARTER_BUSY_9GIB).tl)
    doc = _doc(a)
    assert "older than a year" not in "\n".join(cost_lines(doc))
    doc["cost"]["price"].update(stale=True, age_days=400)
    assert f"price dated {row.date} is older than a year" in "\n".join(cost_lines(doc))


def _doc(a) -> dict:
    return {
        "schema_version": "1.0",
        "tool": {"name": "gpudiag", "version": "0"},
        "run": {"mode": "replay", "command": None, "pid": None, "duration_s": 1.0},
        "environment": {},
        "probes": [],
        "metrics": a.metrics,
        "breakdown": a.breakdown.to_dict(),
        "findings": [f.to_dict() for f in a.findings],
        "cost": a.cost,
        "right_size": a.right_size,
        "errors": [],
    }


@pytest.mark.parametrize("name,bound", [("starved", "input-bound"), ("launch", "host-bound")])
def test_host_and_input_bound_jobs_run_as_fast_on_a_cheaper_model(name, bound):
    rs = right(name)
    assert rs["available"] and rs["kind"] == "model"
    assert rs["basis"]["bound"] == bound
    assert rs["basis"]["host_share"] > 0.5  # the GPU idles most of the loop (its counters)
    by = rows(rs)
    cur = by["H100-SXM"]
    assert cur["measured"] and cur["relative_speed"] == 1.0
    for r in rs["rows"]:
        assert r["relative_speed"] == pytest.approx(1.0, abs=0.01), r
    cheapest = min(rs["rows"], key=lambda r: r["usd_per_gpu_hour"])
    assert rs["same_speed"] == cheapest["model"] != "H100-SXM"
    assert rs["statements"][0].startswith(f"This job is {bound}: ")
    assert "; model)" in rs["statements"][0]  # labelled a model, with its band


def test_fp32_job_scales_with_fp32_throughput_tensor_cores_idle():
    rs = right("fp32")
    b = rs["basis"]
    assert b["counters"]["gpm_tensor_active"] == 0.0  # the recording's tensor cores idle
    assert b["split_of_gpu_time"]["tensor"] == 0.0
    assert max(b["split_of_gpu_time"], key=b["split_of_gpu_time"].get) == "compute"
    assert b["bound"].startswith("FP32-compute-bound")
    split = b["split_of_gpu_time"]
    by = rows(rs)
    for r in rs["rows"]:
        g = sum(split[k] / r["ratios"].get(k, 1.0) for k in split)
        assert r["relative_speed"] == pytest.approx(1 / g, rel=0.01), r
        lo, hi = r["relative_speed_band"]
        assert lo <= r["relative_speed"] <= hi
    a100 = by["A100-80"]  # slower FP32 units: the job slows with them
    assert a100["relative_speed"] == pytest.approx(a100["ratios"]["compute"], rel=0.15)
    assert by["L4"]["relative_speed"] <= by["L4"]["ratios"]["compute"]  # (and its memory)
    # the L40S has more FP32 throughput than the H100 (91.6 vs 67 TFLOPS): not slower
    assert by["L40S"]["relative_speed"] >= 1.0


def test_healthy_bf16_job_scales_with_the_bf16_ratio():
    rs = right("healthy")
    b = rs["basis"]
    split = b["split_of_gpu_time"]
    assert b["bound"] == "tensor-bound" and b["gpu_busy"] > 0.95
    assert max(split, key=split.get) == "tensor"
    # the split is the counters over the GPU's busy time
    c = b["counters"]
    assert split["tensor"] == pytest.approx(c["gpm_tensor_active"] / c["nvml_utilization"], 0.01)
    for r in rs["rows"]:
        if r["measured"]:
            continue
        bf16, hbm = r["ratios"]["tensor"], r["ratios"]["memory"]
        expected = 1 / (
            split["tensor"] / bf16
            + split["memory"] / hbm
            + split["compute"] / r["ratios"]["compute"]
            + split["latency"]
        )
        assert r["relative_speed"] == pytest.approx(expected, rel=0.01), r
        if bf16 < 1:  # a slower model: nearer its bf16 ratio than its bandwidth's
            assert abs(r["relative_speed"] - bf16) < abs(r["relative_speed"] - hbm), r
    assert rs["same_speed"] is None  # nothing cheaper keeps a tensor-bound job's speed
    assert "no cheaper reference GPU keeps it within 10%" in rs["statements"][0]
    # the A100 is cheaper per step only by the central figure, not across its band
    assert rs["per_unit"] == "A100-80" and "not a sure saving" in rs["statements"][1]


def test_no_gpm_names_the_missing_signals_and_shows_no_rows():
    rs = analyze(timeline(QUARTER_BUSY_9GIB).tl).right_size
    assert not rs["available"] and "rows" not in rs
    assert rs["missing"] == [
        "gpm_sm_active (SM activity)",
        "gpm_tensor_active (tensor-core activity)",
        "gpm_dram_bw (DRAM bandwidth)",
    ]
    assert rs["ceiling"] == pytest.approx(1 / rs["host_share"], rel=0.01)
    assert "which no GPU model changes" in rs["statement"]


def test_unknown_gpu_has_no_projection():
    a = analyze(timeline(FakeGpu(name="Mystery Accelerator", job_pids=[ME])).tl)
    assert (
        a.right_size["available"] is False
        and "not in the reference table" in (a.right_size["reason"])
    )
    # a GPU the job does not use: nothing to right-size, no key in the report
    assert analyze(timeline(FakeGpu(job_pids=[ME + 1])).tl).right_size == {}


def test_serial_and_overlapping_models_bound_the_band():
    split = {"tensor": 1.0, "memory": 0.0, "compute": 0.0, "latency": 0.0}
    r = {"tensor": 0.5, "memory": 1.0, "compute": 1.0, "latency": 1.0}
    overlap = Bound(0.25, split, False, "overlapping")
    serial = Bound(0.25, split, True, "serial")
    assert speed_of(overlap, r)[0] == pytest.approx(1.0)  # GPU time hides under the host's
    assert speed_of(serial, r)[0] == pytest.approx(1 / 1.25)  # GPU time adds: 0.75 + 0.5
    _, lo, hi = speed_of(overlap, r)
    assert lo < 1 / 1.25 < hi >= 1.0


def test_cost_per_1000_units_of_work_follows_the_workload_unit():
    assert unit_rate({"steps_per_second": 4.0}, "training") == ("step", "steps_per_second", 4.0)
    assert unit_rate({"requests_per_second": 50.0}, "server")[:2] == (
        "request",
        "requests_per_second",
    )
    both = {"items_per_second": 800.0, "forwards_per_second": 25.0}
    assert unit_rate(both, "inference")[0] == "item"
    assert unit_rate({}, "server") == ("request", "requests_per_second", None)
    a = replay("starved")
    cost, rs = a.cost, a.right_size
    sps = a.metrics["steps_per_second"]
    assert cost["unit"] == "step"
    assert cost["usd_per_1000_units"] == pytest.approx(cost["usd_per_hour"] / (sps * 3.6), rel=1e-3)
    cur = rows(rs)["H100-SXM"]
    assert cur["usd_per_1000_units"] == pytest.approx(cost["usd_per_1000_units"], rel=1e-3)


def test_a_users_price_for_another_model_is_used_in_its_row():
    assert "reference table" in rows(right("starved"))["L4"]["price_source"]
    _rec, samples = read_recording(str(FIXTURES / "starved.jsonl.gz"))
    tl = Timeline()
    tl.extend(samples)
    a = analyze(tl, price_table={"L4": 0.10})
    l4 = rows(a.right_size)["L4"]
    assert l4["usd_per_gpu_hour"] == 0.10 and "user price table" in l4["price_source"]


def test_metrics_serve_cost_per_unit_and_the_right_size_rows():
    a = replay("starved")
    doc = {**_doc(a), "probes": [{"name": "gpu", "available": True}]}
    fams = _families(doc)
    unit = fams["gpudiag_usd_per_1000_units"]
    assert [s.labels["unit"] for s in unit] == ["step"]
    assert unit[0].value == pytest.approx(a.cost["usd_per_1000_units"])
    speed = {
        (s.labels["gpu_model"], s.labels["basis"]): s.value
        for s in fams["gpudiag_right_size_relative_speed_ratio"]
    }
    assert speed[("H100-SXM", "measured")] == 1.0 and ("L4", "model") in speed


def test_mem001_and_cost001_point_at_the_right_size_pick():
    a = replay("starved")
    line = a.right_size["statements"][0]
    mem = next(f for f in a.findings if f.id == "MEM001")
    cost = next(f for f in a.findings if f.id == "COST001")
    assert f"or run on a cheaper GPU: {line}" in mem.recommendation.actions
    assert f"right-size: {line}" in cost.recommendation.actions
    assert mem.severity == "note"  # headroom is information; the idle spend stays COST001's
