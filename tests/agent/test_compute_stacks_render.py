"""The report's compute_stacks (plain attach's split of the model's time by call site, issue
55) in the report and in every renderer, with its units."""

from __future__ import annotations

from tests.analyzers.test_compute_split import GPT, split_of


def gpt_doc() -> dict:
    from gpudiag.agent.output.report import RunInfo, build_report
    from gpudiag.analyzers.model.thresholds import Thresholds

    return build_report(
        analysis=split_of(GPT),
        run_info=RunInfo("attach", None, 42, 0.0, 15.0, "duration_reached", None),
        environment={"host": "h", "cpu_count": 8, "python": "3.11"},
        probes=[],
        errors=[],
        thresholds=Thresholds(),
    )


def test_the_report_carries_the_split_and_every_renderer_shows_it_with_units():
    from gpudiag.agent.output.render.html import render_html
    from gpudiag.agent.output.render.text import render_markdown, render_text
    from gpudiag.agent.output.report import validate
    from gpudiag.tui.widgets import metrics_text

    doc = gpt_doc()
    validate(doc)
    assert doc["compute_stacks"]["rows"][0]["label"].startswith("Linear called at model.py:88")
    text = render_text(doc)
    assert "Model time by call site (from the stacks; % of the loop's" in text
    assert "samples  Linear called at model.py:88 (GPT.forward)" in text
    assert "Model time by call site" in render_markdown(doc)
    assert "Linear called at model.py:88 (GPT.forward)</td>" in render_html(doc)
    panel = metrics_text(doc).plain(100)
    assert "Model time by call site (stacks, % of the loop, CPU time)" in panel
    assert "40%" in panel and "Linear called at model.py:88" in panel
