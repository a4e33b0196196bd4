"""Text that leaves gpudiag is redacted (secret shapes) and escaped for its format (controls,
JUnit attributes, HTML, Rich markup in `top`); harmless text is left alone."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "text, secret",
    [
        ('{"api_key": "abc123xyz"}', "abc123xyz"),
        ("['--token', 'abc123xyz']", "abc123xyz"),
        ("password = abc123xyz", "abc123xyz"),
        ("Bearer abc123xyz", "abc123xyz"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N", "dozjgNryP4J3j"),
        ("key sk_live_abcdefghijklmnop1234", "abcdefghijklmnop"),
        ("AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", "abcdefghijklmnop"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEabc123xyz\n-----END RSA PRIVATE KEY-----", "MIIE"),
        ("connect admin:abc123xyz@db.internal:5432", "abc123xyz"),
        ("mysql -u root -pabc123xyz db", "abc123xyz"),
    ],
)
def test_secret_shapes_are_hidden(text, secret):
    from gpudiag.text.redact import redact_argv, redact_lines, redact_text

    assert secret not in redact_text(text)
    assert secret not in " ".join(redact_argv(["prog", text]) or [])
    assert secret not in " ".join(redact_lines(text.split("\n")) or [])


def test_harmless_text_is_left_alone():
    from gpudiag.text.redact import redact_argv, redact_text

    for text in ("loss = 0.5 max_tokens = 12", "train.py:12 in step", "-pthread -O2"):
        assert redact_text(text) == text
    assert redact_argv(["mysql", "-p", "abc"]) == ["mysql", "-p", "***"]
    assert redact_argv(["gcc", "-O2"]) == ["gcc", "-O2"]


def test_escapes_and_controls_are_stripped():
    """ESC/OSC sequences from the job's argv and output reached the terminal raw; a newline
    in argv forged log lines."""
    from gpudiag.text.redact import printable

    raw = "a\x1b]52;c;cHduZWQ=\x07b\x1b[2J\x1b[31mc\x9b1Jd\u202ee\nforged: line"
    out = printable(raw)
    assert "\x1b" not in out and "\x9b" not in out and "\u202e" not in out and "\n" not in out
    assert out.startswith("abcde forged") and printable("x\ny", lines=True) == "x\ny"


def test_junit_attributes_are_quote_escaped(tmp_path):
    """The JUnit `name` attribute was not quote-escaped."""
    import xml.etree.ElementTree as ET

    from gpudiag.agent.commands.gate_output import junit_xml
    from gpudiag.analyzers.stats.gate import Comparison

    name = 'm" injected="1\x01'
    c = Comparison(name, "fail", 1.0, 0.5, -0.5, -0.6, -0.4, 5, 5, 0.1, 'why "quoted"')
    path = tmp_path / "j.xml"
    junit_xml(str(path), [c], "note 'x'")
    case = ET.parse(path).getroot().find("testcase")
    assert case.get("name") == 'm" injected="1' and case.get("injected") is None


def test_gate_comparisons_are_escaped_in_html():
    """A report's gate.comparisons fields reached the HTML page unescaped and ran script."""
    from gpudiag.agent.output.render.html import _gate

    evil = "<script>alert(1)</script>"
    comp = {"metric": "m", "verdict": "fail", "baseline": evil, "current": 1.0}
    comp.update(delta=0.1, ci_low=evil, ci_high=0.2, n_baseline=evil, n_current=3)
    page = _gate({"gate": {"verdict": "fail", "comparisons": [comp]}})
    assert "<script>" not in page and "&lt;script&gt;" in page
