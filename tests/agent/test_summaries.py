"""What `run`, `attach` and `report` print: parseable, explained, escaped, and honest about a
job that never got going."""

from __future__ import annotations

from markdown_it import MarkdownIt

from gpudiag.agent.output.render.text import render_markdown, render_text
from gpudiag.agent.output.report import write_report
from tests.agent.test_report import make_doc


def test_format_help_says_where_the_job_output_goes(cli):
    for command in ("run", "attach", "report", "replay"):
        res = cli(command, "--help")
        text = " ".join(res.stdout.split())
        # report and replay also render the HTML page
        choices = "{text,markdown,json,html}" if command in ("report", "replay") else None
        choices = choices or "{text,markdown,json}"
        assert f"--format {choices}" in text
        described = text.rsplit(f"--format {choices}", 1)[1].split(" --")[0]
        assert "markdown" in described and "json" in described, command
    assert "job's own stdout is sent to stderr" in " ".join(cli("run", "--help").stdout.split())


def test_short_summary_keeps_the_evidence_line():
    text = render_text(make_doc(), verbose=False)  # what run and attach print
    assert "Why: data_wait_share = 60.0% (>= data_wait_warn 10.0%) [stacks]" in text
    assert "Evidence:" not in text  # the full list stays in `gpudiag report`


def test_markdown_escapes_names_from_the_users_code(tmp_path, cli):
    doc = make_doc()
    f = doc["findings"][0]
    f["message"] = "Most time is in SpectrogramDataset.__getitem__ (*slow* | [io])"
    f["recommendation"]["actions"].append("cache the output of __getitem__")
    f["location"] = "data.py:12:SpectrogramDataset.__getitem__"
    md = render_markdown(doc)
    html = MarkdownIt("gfm-like").render(md)
    assert "<strong>getitem</strong>" not in html and "<em>" not in html
    assert "SpectrogramDataset.__getitem__ (*slow* | [io])" in html
    assert "cache the output of __getitem__" in html
    assert "<code>data.py:12:SpectrogramDataset.__getitem__</code>" in html
    path = write_report(doc, tmp_path / "r.json")
    assert cli("report", str(path), "--format", "markdown").stdout == md


def test_a_job_gone_during_a_slow_start_up_never_reached_its_loop():
    """On a busy box py-spy can catch the interpreter starting (a few samples, all "other")
    before a job that cannot open its script exits: still no loop, not "5 samples of 150"."""
    from gpudiag.agent.output.render.text import no_diagnosis_line

    doc = {
        "run": {"end_reason": "target_exited", "exit_code": 2, "duration_s": 0.9},
        "breakdown": {"samples": 5, "shares": {"other": 1.0, "forward": 0.0}},
        "thresholds": {"min_loop_samples": 150},
        "probes": [{"name": "stacks", "available": True}],
        "metrics": {"steps": None},
    }
    assert no_diagnosis_line(doc).endswith("before its training loop started.")
    doc["breakdown"]["shares"] = {"other": 0.4, "forward": 0.6}  # it was in its loop
    assert "with 5 loop samples (150 needed)" in no_diagnosis_line(doc)
