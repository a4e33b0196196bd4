"""`--format html`: one self-contained page with the timeline, findings, GPU panels, money
and flame graph, that fetches nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.commands.replay import replay_report
from gpudiag.agent.output.render.html import render_html
from gpudiag.agent.output.report import validate, write_report

H100 = Path(__file__).parents[1] / "fixtures" / "h100"

# anything a browser would fetch: src=/href=/url()/@import to a remote or protocol-relative URL
REMOTE = re.compile(
    r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:|//)|url\(\s*["']?\s*(?:https?:|//)"""
    r"""|@import|<script[^>]+src|<link[^>]+href""",
    re.I,
)


@pytest.fixture(scope="module")
def starved() -> dict:
    """The report of a real H100 run starved by its input pipeline (DATA001)."""
    doc = replay_report(str(H100 / "starved.jsonl.gz"), load_settings(None, None))
    validate(doc)
    return doc


def test_report_carries_the_timeline_and_stacks_it_draws(starved):
    series, stacks = starved["series"], starved["stacks"]
    assert 0 < len(series["points"]) <= 240
    assert any(p["gpu_util"].get("0") is not None for p in series["points"])
    assert sum(p["steps"] for p in series["points"]) > 100  # the hooks timed the steps
    assert any(p["phases"].get("data_wait", 0) > 0.5 for p in series["points"])
    assert series["loop_start_s"] is not None and series["loop_end_s"] > series["loop_start_s"]
    assert stacks["stacks"] and stacks["frames"]
    assert not any(f.startswith(("process ", "thread (")) for f in stacks["frames"])
    top = max(stacks["stacks"], key=lambda s: s["count"])
    assert top["category"] == "data_wait"


def test_html_has_findings_evidence_fixes_charts_and_money(starved):
    page = render_html(starved)
    assert page.startswith("<!DOCTYPE html>")
    for f in starved["findings"]:
        assert f["id"] in page and f["title"] in page
    assert "num_workers=12" in page  # the fix, with its value
    assert "data_wait_share" in page  # evidence
    assert page.count("<svg") >= 4  # timeline, breakdown, GPU sparkline, flame graph
    assert "Flame graph of the loop thread" in page and "Decode.__getitem__" in page
    assert "NVIDIA H100 80GB HBM3" in page  # the GPU panel
    assert "/day" in page and "$" in page  # the money


def test_html_fetches_nothing(starved):
    page = render_html(starved)
    assert "<script" not in page
    assert not REMOTE.search(page), REMOTE.search(page).group(0)


def test_remote_check_catches_a_cdn_script():
    assert REMOTE.search('<script src="https://cdn.plot.ly/plotly.min.js"></script>')
    assert REMOTE.search("<img src=//example.com/x.png>")


def test_text_from_the_report_is_escaped(starved):
    doc = json.loads(json.dumps(starved))
    doc["findings"][0]["message"] = "<img src=https://evil.example/x onerror=alert(1)>"
    page = render_html(doc)
    assert "<img src=https://evil" not in page
    assert "&lt;img src=https://evil.example/x" in page


def test_report_command_writes_html(tmp_path, starved, cli):
    rep = write_report(starved, tmp_path / "r.json")
    out = tmp_path / "r.html"
    res = cli("report", str(rep), "--format", "html", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout == ""
    assert "DATA001" in out.read_text()


def test_replay_prints_html(tmp_path, cli):
    res = cli("replay", str(H100 / "fp32.jsonl.gz"), "--format", "html")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("<!DOCTYPE html>") and "GPU003" in res.stdout


def test_report_html_to_a_missing_folder_is_one_line(tmp_path, starved, cli):
    rep = write_report(starved, tmp_path / "r.json")
    res = cli("report", str(rep), "--format", "html", "--out", str(tmp_path / "no/x.html"))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "does not exist" in res.stderr


def test_healthy_cpu_report_without_series_still_renders():
    doc = json.loads((Path(__file__).parents[2] / "tests/fixtures/html/minimal.json").read_text())
    validate(doc)
    page = render_html(doc)
    assert "No findings" in page and "No GPU in this report" in page
    assert "No samples over time" in page


def test_gate_writes_its_comparison_as_html(tmp_path, cli):
    from tests.agent.test_gate import report

    base = report(tmp_path, "base.json", 0.1)
    slow = [report(tmp_path, f"w{i}.json", 0.15 * (1 + 0.01 * i)) for i in range(3)]
    page = tmp_path / "g.html"
    res = cli(
        "gate", "--baseline", base, "--out", str(tmp_path / "g.json"), "--html", str(page), *slow
    )
    assert res.returncode == 1, res.stdout + res.stderr
    text = page.read_text()
    assert "CI gate: FAIL" in text and "steps_per_second" in text
    assert text.index("FAIL</b>") < text.index("PASS</b>") if "PASS</b>" in text else True
    assert not REMOTE.search(text)
    # the saved gate report renders the same section
    res = cli("report", str(tmp_path / "g.json"), "--format", "html")
    assert "CI gate: FAIL" in res.stdout
