"""End to end: `gpudiag run --capture-steps N`: the capture's summary lands in the report, the HTML
page and the Chrome trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.commands.replay import replay_report
from gpudiag.agent.output.render.html import render_html
from gpudiag.agent.output.report import load_report
from tests.conftest import WORKLOADS, gpudiag

CHROME = json.loads(
    (Path(__file__).parents[2] / "schemas" / "chrome-trace-event.schema.json").read_text()
)


def test_run_with_capture_steps_puts_the_summary_in_the_report(tmp_path):
    pytest.importorskip("torch")
    out, trace, rec = tmp_path / "r.json", tmp_path / "t.json", tmp_path / "rec.jsonl.gz"
    res = gpudiag(
        "run",
        "-q",
        "--capture-steps",
        "3",
        "--record",
        str(rec),
        "--out",
        str(out),
        "--trace",
        str(trace),
        "--",
        sys.executable,
        str(WORKLOADS / "capture_job.py"),
        "40",
        timeout=240,
    )
    assert res.returncode == 0, res.stderr
    doc = load_report(str(out))  # validates against the schema
    cap = doc["capture"]
    assert len(cap["steps"]) == 3 and cap["device"] == "cpu"
    assert 0 <= cap["start_s_run"] <= doc["run"]["duration_s"]
    assert set(cap["idle_by_host_s"]) == {"data", "sync", "launch", "python", "profiler"}
    assert "Profiler capture" in render_html(doc) and "3 steps captured on cpu" in render_html(doc)
    t = json.loads(trace.read_text())
    jsonschema.validate(t, CHROME)
    steps = [e for e in t["traceEvents"] if e.get("cat") == "capture"]
    assert [e["name"] for e in steps] == ["step 1", "step 2", "step 3"]
    assert any(e.get("cat") == "CPU ops (loop thread)" for e in t["traceEvents"])
    # the recording keeps the capture: the replayed report has the same summary
    replayed = replay_report(str(rec), load_settings(None, None))
    assert replayed["capture"]["steps"] == cap["steps"]
    assert replayed["capture"]["top_ops"] == cap["top_ops"]
