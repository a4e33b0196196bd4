"""The diagnosis view at 80x24 and 100x30: the findings table fits, values keep their units,
names are not cut in the middle, and a saved report offers only keys that do something."""

from __future__ import annotations

import pytest
from rich.console import Console

from gpudiag.analyzers.cost.prices import row_of
from gpudiag.tui.screens import finding_text
from gpudiag.tui.widgets import metrics_text
from tests.tui.snapshot_apps import scenario


def lines_at(renderable, width: int) -> list[str]:
    console = Console(width=width, color_system=None, record=True)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get().splitlines()


@pytest.mark.parametrize("width", range(30, 101, 7))
def test_panel_values_never_split_from_their_units(width):
    lines = lines_at(metrics_text(scenario("hooked")), width)
    for value in (
        "17.34 steps/s",
        "1110 samples/s",
        "p50 57 ms",
        "p95 70 ms",
        "4 using 3.6 cores",
        "VRAM peak 60.0 GiB",
        "20% of 16 cores",
        f"${row_of('H100-SXM').usd_per_gpu_hour * 24:,.0f}/day",  # the reference price
    ):
        assert any(value in ln for ln in lines), (value, lines)


@pytest.mark.parametrize("width", range(40, 101, 6))
def test_detail_keeps_names_and_numbers_whole(width):
    f = scenario("hooked")["findings"][0]
    lines = lines_at(finding_text(f), width)
    assert any("_BaseDataLoaderIter.__next__" in ln or ln.strip() == "__next__" for ln in lines), (
        lines
    )  # broken after a separator, never inside a name
    for value in ("12.80 cores", "0.50 cores", "3 workers", "12.8 of", "num_workers=3"):
        assert any(value in ln for ln in lines), (value, lines)


def test_a_long_run_shows_which_period_had_which_finding():
    """A job healthy for 20 hours and starved for 4 says so in the numbers panel too."""
    doc = dict(scenario("hooked"))
    doc["periods"] = [
        {
            "start_s": h * 3600.0,
            "end_s": (h + 1) * 3600.0,
            "finding": None,
            "impact": 0.0,
            "gpu_idle": 0.05,
        }
        for h in range(20)
    ] + [
        {
            "start_s": h * 3600.0,
            "end_s": (h + 1) * 3600.0,
            "finding": "DATA001",
            "impact": 0.6,
            "gpu_idle": 0.62,
        }
        for h in range(20, 24)
    ]
    text = "\n".join(lines_at(metrics_text(doc), 60))
    assert "Over time" in text and "12 earlier periods: see the report" in text
    assert "23:00:00-24:00:00" in text and "DATA001 (60%)" in text
    assert "19:00:00-20:00:00" in text and "no bottleneck" in text


def test_a_server_gets_the_request_view_and_a_training_job_keeps_its_rows():
    """Requests/s, latency percentiles, in flight and the forwards' batch for a server (no
    'throughput n/a': it has no steps); a training report shows no workload row."""
    doc = {
        "workload": {"kind": "server", "unit": "request"},
        "metrics": {
            "requests_per_second": 349.3,
            "request_latency_p50_s": 0.0082,
            "request_latency_p95_s": 0.0168,
            "request_latency_p99_s": 0.0239,
            "requests_in_flight_mean": 3.11,
            "requests_in_flight_max": 5.0,
            "forwards_per_second": 349.3,
            "items_per_second": 349.3,
            "forward_batch_p50": 1.0,
        },
        "probes": [],
    }
    text = metrics_text(doc).plain(100)
    for value in ("349.3/s", "p50 8.2 ms", "p95 16.8 ms", "p99 23.9 ms", "3.1 on average", "max 5"):
        assert value in text, (value, text)
    assert "batch p50 1" in text and "server (unit: the request)" in text
    assert "no in-process step timing" not in text
    training = metrics_text(scenario("hooked")).plain(100)
    assert "workload" not in training and "steps/s" in training


def test_an_inference_loops_padding_is_a_row_of_its_view():
    doc = {
        "workload": {"kind": "inference", "unit": "batch"},
        "metrics": {
            "forwards_per_second": 1.1,
            "items_per_second": 36.0,
            "forward_batch_p50": 32.0,
            "padding_share": 0.78,
            "padded_length_mean": 156.2,
            "longest_length_mean": 156.2,
            "real_length_mean": 34.1,
        },
        "probes": [],
    }
    text = metrics_text(doc).plain(100)
    for value in ("78% padding", "padded to 156", "longest 156", "real 34"):
        assert value in text, (value, text)
