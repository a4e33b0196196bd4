"""A bound reads as a bound everywhere (summary, markdown, HTML, TUI): "up to ×5.8", and the
cost headline's figure is a modelled one where a top finding has one (issue 26, item 3)."""

from __future__ import annotations

import copy

from gpudiag.agent.output.render.html import render_html
from gpudiag.agent.output.render.text import render_markdown, render_text
from gpudiag.agent.output.report import validate
from gpudiag.analyzers.cost.money import Spend, cost_analysis
from gpudiag.analyzers.cost.prices import Price
from gpudiag.analyzers.measures.gpu_stats import GpuStats
from gpudiag.analyzers.model.results import Finding, Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.tui.screens import finding_text
from tests.agent.test_report import make_doc

BOUND_BASIS = "a bound: x5.76 if loading cost nothing (the wait removed)"


def _bound_doc() -> dict:
    doc = copy.deepcopy(make_doc())
    f = doc["findings"][0]
    f.update(expected_speedup=5.76, speedup_kind="bound", speedup_basis=BOUND_BASIS)
    validate(doc)
    return doc


def test_a_bound_reads_up_to_in_text_markdown_html_and_tui():
    doc = _bound_doc()
    text = render_text(doc)
    assert "up to ×5.8" in text and "×5.76" not in text
    assert "expected speed-up ×5.76" not in text
    md = render_markdown(doc)
    assert "| up to ×5.8 |" in md
    html = render_html(doc)
    assert "up to ×5.8" in html and "Expected speed-up if fixed: <b>x5.76" not in html
    assert "Speed-up bound" in html
    tui = finding_text(doc["findings"][0]).plain(100)
    assert "up to ×5.8" in tui and "expected speed-up ×5.76" not in tui


def test_a_modelled_figure_keeps_its_two_decimals():
    doc = copy.deepcopy(make_doc())
    f = doc["findings"][0]
    f.update(expected_speedup=2.65, speedup_kind="model", speedup_basis="loader rate ...")
    assert "expected speed-up ×2.65" in render_text(doc)
    assert "up to" not in render_markdown(doc).split("|---|")[-1].split("\n\n")[0]


def test_an_old_report_without_the_field_reads_its_basis():
    doc = _bound_doc()
    del doc["findings"][0]["speedup_kind"]
    assert "up to ×5.8" in render_text(doc)


def _finding(fid: str, speed: float, kind: str, impact: float) -> Finding:
    return Finding(
        id=fid,
        title=fid,
        severity="error",
        confidence=0.9,
        impact=impact,
        message="m",
        evidence=(),
        recommendation=Recommendation("fix", ()),
        expected_speedup=speed,
        speedup_kind=kind,
        speedup_basis="a bound: ..." if kind == "bound" else "model",
    )


def test_cost_headline_is_the_modelled_figure_where_there_is_one():
    stats = [GpuStats(index="0", name="NVIDIA H100 80GB HBM3", samples=10, busy=0.2)]
    price = Price(3.0, "test")
    bound = _finding("DATA002", 5.76, "bound", 0.8)
    model = _finding("HOST001", 2.65, "model", 0.5)
    section, _ = cost_analysis(Spend(stats, {}, price), [bound, model], Thresholds())
    fixed = section["if_fixed"]
    assert fixed["findings"] == ["HOST001"] and fixed["expected_speedup"] == 2.65
    assert fixed["speedup_kind"] == "model"
    only_bound, _ = cost_analysis(Spend(stats, {}, price), [bound], Thresholds())
    assert only_bound["if_fixed"]["speedup_kind"] == "bound"
