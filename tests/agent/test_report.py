"""Reports validate against the shipped schema, are written atomically and render."""

from __future__ import annotations

import json
import time
from importlib import resources

import jsonschema
import pytest

from gpudiag.agent.output.render.text import render_markdown, render_text
from gpudiag.agent.output.report import RunInfo, build_report, load_report, validate, write_report
from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.base import ProbeStatus
from tests.analyzers.scenario import Scenario


def make_doc() -> dict:
    sc = Scenario(cpu_count=8)
    for _ in range(5):
        sc.window({"data_wait": 0.6, "forward": 0.2, "backward": 0.2})
    sc.host(0.2).process(0.9)
    now = time.time()
    return build_report(
        analysis=analyze(sc.tl),
        run_info=RunInfo(
            "run", ["python", "train.py"], 123, now - 15, now, "duration_reached", None
        ),
        environment={"host": "h", "cpu_count": 8, "python": "3.11.7", "gpus": []},
        probes=[
            ProbeStatus("stacks", True),
            ProbeStatus("gpu", False, "no NVIDIA driver", "install the driver"),
        ],
        errors=[],
        thresholds=Thresholds(),
    )


def test_report_validates_and_round_trips(tmp_path):
    doc = make_doc()
    validate(doc)
    path = write_report(doc, tmp_path / "r.json")
    assert load_report(str(path)) == doc
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left over


def test_schema_rejects_a_broken_report():
    doc = make_doc()
    doc["findings"][0]["severity"] = "catastrophic"
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)
    with pytest.raises(jsonschema.ValidationError):
        write_report(doc, "/tmp/never-written.json")


def test_schema_command_prints_the_shipped_schema(cli):
    res = cli("schema")
    assert res.returncode == 0
    shipped = resources.files("gpudiag.agent.output").joinpath("report.schema.json").read_text()
    assert json.loads(res.stdout) == json.loads(shipped)


def test_text_and_markdown_show_findings_with_units_and_fix(tmp_path, cli):
    doc = make_doc()
    text = render_text(doc)
    assert "DATA001" in text and "num_workers=" in text
    assert "data_wait_share = 60.0% (>= data_wait_warn 10.0%)" in text
    assert "gpu: no NVIDIA driver — fix: install the driver" in text
    md = render_markdown(doc)
    assert "| 1 | DATA001 | error |" in md
    path = write_report(doc, tmp_path / "r.json")
    res = cli("report", str(path), "--format", "markdown")
    assert res.returncode == 0 and res.stdout == md


def test_a_run_that_stopped_once_its_verdict_was_sure_validates():
    """The session ends with end_reason 'verdict_sure'; the schema must accept it."""
    doc = make_doc()
    doc["run"]["end_reason"] = "verdict_sure"
    validate(doc)
