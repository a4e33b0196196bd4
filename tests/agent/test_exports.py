"""--speedscope and --trace: exports other tools open, checked against their formats."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.replay import replay_report
from gpudiag.agent.output.exports import chrome_trace_of, speedscope_of
from gpudiag.agent.output.report import write_report

HERE = Path(__file__).parents[1]
H100 = HERE / "fixtures" / "h100"
SPEEDSCOPE = json.loads((HERE / "schemas" / "speedscope-file-format-schema.json").read_text())
CHROME = json.loads((HERE / "schemas" / "chrome-trace-event.schema.json").read_text())


@pytest.fixture(scope="module")
def ckpt() -> dict:
    return replay_report(str(H100 / "ckpt.jsonl.gz"), load_settings(None, None))


def test_speedscope_file_matches_the_schema_and_the_stacks(ckpt):
    doc = speedscope_of(ckpt)
    jsonschema.validate(doc, SPEEDSCOPE)
    prof = doc["profiles"][0]
    assert len(prof["samples"]) == len(prof["weights"]) == len(ckpt["stacks"]["stacks"])
    assert sum(prof["weights"]) == pytest.approx(ckpt["stacks"]["samples"], rel=1e-6)
    names = {f["name"] for f in doc["shared"]["frames"]}
    assert any("save" in n for n in names)  # the checkpoint's torch.save is in the profile
    frames = doc["shared"]["frames"]
    assert all(0 <= i < len(frames) for s in prof["samples"] for i in s)
    assert any(f.get("line") for f in frames) and any(f.get("file") for f in frames)


def test_chrome_trace_matches_the_trace_event_format(ckpt):
    doc = chrome_trace_of(ckpt)
    jsonschema.validate(doc, CHROME)
    ev = doc["traceEvents"]
    names = {e["name"] for e in ev if e["ph"] == "X"}
    assert {"start-up", "loop"} <= names and "checkpoint" in names
    assert any(e["ph"] == "C" and e["name"] == "GPU utilisation %" for e in ev)
    loop = next(e for e in ev if e["name"] == "loop")
    assert loop["dur"] == pytest.approx(ckpt["phases"]["loop_s"] * 1e6, rel=0.1)


def test_trace_schema_rejects_a_complete_event_without_duration():
    bad = {"traceEvents": [{"name": "x", "ph": "X", "ts": 0, "pid": 1, "tid": 1}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, CHROME)


def test_exports_are_small_by_construction(ckpt, tmp_path, cli):
    rep = write_report(ckpt, tmp_path / "r.json")
    res = cli(
        "report",
        str(rep),
        "--speedscope",
        str(tmp_path / "s.json"),
        "--trace",
        str(tmp_path / "t.json"),
    )
    assert res.returncode == 0, res.stderr
    assert "speedscope profile written" in res.stderr and "trace written" in res.stderr
    assert (tmp_path / "s.json").stat().st_size < 200_000
    assert (tmp_path / "t.json").stat().st_size < 200_000
    jsonschema.validate(json.loads((tmp_path / "t.json").read_text()), CHROME)


def test_replay_writes_both_exports(tmp_path, cli):
    s, t = tmp_path / "s.json", tmp_path / "t.json"
    res = cli("replay", str(H100 / "launch.jsonl.gz"), "--speedscope", str(s), "--trace", str(t))
    assert res.returncode == 0, res.stderr
    jsonschema.validate(json.loads(s.read_text()), SPEEDSCOPE)
    jsonschema.validate(json.loads(t.read_text()), CHROME)


def test_speedscope_of_a_report_without_stacks_says_so():
    doc = json.loads((HERE / "fixtures" / "html" / "minimal.json").read_text())
    with pytest.raises(UsageError, match="no stacks"):
        speedscope_of(doc)
    jsonschema.validate(chrome_trace_of(doc), CHROME)  # an empty timeline is still a trace


def test_capture_events_without_a_start_are_left_out(tmp_path, cli):
    """Issue 53 N47: a schema-valid capture whose events lack `ts` (or hold a string there)
    gave "internal error: KeyError" from report --trace."""
    doc = json.loads((HERE / "fixtures" / "html" / "minimal.json").read_text())
    doc["capture"] = {
        "start_s_run": "soon",
        "steps": [{"start_s": 0.0, "dur_s": 0.1}],
        "events": [
            {"name": "no start"},
            {"name": "aten::mm", "ts": 0.01, "dur": 0.002},
            {"name": "odd", "ts": "x", "dur": "y"},
        ],
    }
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    res = cli("report", str(path), "--trace", str(tmp_path / "t.json"))
    assert res.returncode == 0, res.stderr
    trace = json.loads((tmp_path / "t.json").read_text())
    jsonschema.validate(trace, CHROME)
    ops = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "ops"]
    assert ops == ["aten::mm"]
