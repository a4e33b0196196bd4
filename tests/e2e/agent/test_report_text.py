"""A report holding text that cannot be encoded (a lone surrogate) is one line of error, not a
traceback."""

from __future__ import annotations

import json

from tests.conftest import gpudiag
from tests.tui.test_app import starved_doc


def test_a_lone_surrogate_in_a_report_is_one_line(tmp_path):
    """A report field holding "\\ud800" (valid JSON) gave 'internal error' on output."""
    doc = starved_doc()
    doc["findings"][0]["message"] = "x \ud800 y"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    res = gpudiag("report", str(path))
    assert res.returncode == 2 and "lone surrogate" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1
    capsys_free = emit_to_string("watching pid 1 (x \udcff.py)")
    assert "\ufffd" in capsys_free


def emit_to_string(text: str) -> str:
    import io

    from gpudiag.text.sink import emit

    buf = io.StringIO()
    emit(text, file=buf)
    return buf.getvalue()
