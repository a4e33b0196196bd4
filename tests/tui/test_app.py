"""Pilot tests of the terminal UI over saved reports and a live-like feed."""

from __future__ import annotations

import time

from gpudiag.agent.output.report import RunInfo, build_report
from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.tui.app import DiagnosisApp
from gpudiag.tui.feeds import static_feed
from tests.analyzers.test_cost import QUARTER_BUSY_9GIB
from tests.analyzers.test_gpu_findings import STARVED, timeline


def starved_doc() -> dict:
    now = time.time()
    return build_report(
        analysis=analyze(timeline(QUARTER_BUSY_9GIB, shares=STARVED).tl),
        run_info=RunInfo(
            "run", ["python", "train.py"], 42, now - 15, now, "duration_reached", None
        ),
        environment={"host": "h", "cpu_count": 16, "python": "3.11"},
        probes=[],
        errors=[],
        thresholds=Thresholds(),
    )


def test_metrics_panel_has_one_row_per_rank_with_the_straggler_marked():
    from gpudiag.tui.widgets import metrics_text

    bd = {"data": 0.7, "compute": 0.2, "collectives": 0.1}
    doc = {
        "metrics": {},
        "probes": [],
        "ranks": [
            {"rank": 0, "step_time_s": 0.13, "breakdown": {"collectives": 0.9}, "gpu": "0"},
            {"rank": 1, "step_time_s": 0.13, "breakdown": bd, "gpu": "1"},
        ],
        "distributed": {"straggler": {"straggler": 1}},
    }
    text = metrics_text(doc).plain(80)
    assert "rank 0" in text and "coll 90%" in text
    assert "rank 1 straggler" in text and "data 70%" in text and "GPU 1" in text
    assert "rank" not in metrics_text({"metrics": {}, "probes": []}).plain(80)


def test_c_does_nothing_on_a_saved_report():
    app = DiagnosisApp(static_feed(starved_doc(), "report"))
    assert app.check_action("capture", ()) is False
