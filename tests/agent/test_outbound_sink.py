"""Outbound text through one sink: the summary, markdown, the watch log and the report TUI
never carry a job's escapes, secrets or markup, and gpudiag's own text is kept."""

from __future__ import annotations

from gpudiag.agent.output.report import write_report
from tests.tui.test_app import starved_doc

EVIL = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x9b31m"  # clipboard write, clear screen, C1 CSI

SECRET = "hf_abcdefghijklmnopqrstuvwx"


def _evil_doc() -> dict:
    doc = starved_doc()
    f = doc["findings"][0]
    f["location"] = f"train.py:12:load{EVIL}"
    f["message"] += f" {EVIL} token {SECRET}"
    f["title"] = "[/x] [bold]title"
    return doc


def test_summary_and_markdown_never_carry_escapes_or_secrets(tmp_path, cli):
    """A frame's name or a job's text holding ESC/OSC reached the terminal raw through the
    text summary and markdown (`report`, and `report --out`, a file someone will `cat`)."""
    report = str(write_report(_evil_doc(), str(tmp_path / "r.json")))
    for fmt in ("text", "markdown"):
        res = cli("report", report, "--format", fmt)
        assert res.returncode == 0, res.stderr
        assert "load" in res.stdout and "[/x" in res.stdout.replace("\\", "")
        assert not any(c in res.stdout for c in "\x1b\x07\x9b") and SECRET not in res.stdout
        out = tmp_path / f"r.{fmt}"
        assert cli("report", report, "--format", fmt, "--out", str(out)).returncode == 0
        assert "\x1b" not in out.read_text() and SECRET not in out.read_text()


def test_a_newline_in_argv_cannot_forge_a_watch_log_line(capsys):
    """`watch` logged a job's command line raw: a newline in it forged a log line."""
    from gpudiag.agent.commands.watch import Watcher

    w = Watcher(settings=None, opts=None)  # type: ignore[arg-type]
    w.log(f"watching pid 7 (python x.py\ngpudiag: pid 1 ended; no longer watched{EVIL})")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpudiag: watching pid 7")
    assert "\x1b" not in err and "\x07" not in err


def test_the_sink_keeps_gpudiags_own_text(capsys, cli):
    """The sink hides secrets and escapes, not gpudiag's words: the settings listing, a
    summary's lines and a path pass unchanged."""
    from gpudiag.text.sink import emit, say

    res = cli("thresholds")
    assert res.returncode == 0 and "= " in res.stdout
    emit(res.stdout, end="")
    say("Report written to /tmp/a b/report.json  (details: gpudiag report x)")
    out = capsys.readouterr()
    assert out.out == res.stdout
    assert (
        out.err == "gpudiag: Report written to /tmp/a b/report.json  (details: gpudiag report x)\n"
    )
