"""Review adversarial-6's small attacks (issue 53, section 3): each one line and exit 2, or
the output it should be, never an internal error."""

from __future__ import annotations

import pytest

from tests.conftest import gpudiag


@pytest.mark.parametrize(
    "argv, words",
    [
        # X08: a 5,000-digit value was "internal error: ValueError: Exceeds the limit"
        (["try", "--fix", "batch:factor=" + "9" * 5000, "--", "false"], "whole number"),
        # X09: passed, then killed the poller thread with an OverflowError and exited 0
        (["watch", "--interval", "1e300", "--duration", "1"], "--interval"),
        # X10: the recording replaced the job's log (the job's output lost)
        (
            ["run", "--tui", "--out", "{tmp}/c.json", "--record", "{tmp}/c.job.log", "--", "true"],
            "name the same file",
        ),
    ],
)
def test_one_line_and_exit_2(tmp_path, argv, words):
    res = gpudiag(*[a.format(tmp=tmp_path) for a in argv], timeout=120)
    assert res.returncode == 2, res.stderr[-400:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "internal error" not in lines[0]
    assert not (tmp_path / "c.job.log").exists()


def test_gpudiags_own_words_are_not_taken_for_secrets():
    """X07: "expected KEY=***" and "internal error: KeyError: ***" (the key a bug report
    needs): the sink's redaction rewrote gpudiag's own messages."""
    from gpudiag.text.redact import redact_text

    res = gpudiag("try", "--fix", "batch:=2", "--", "false", timeout=60)
    assert res.returncode == 2 and "expected name=value, got '=2'" in res.stderr
    res = gpudiag("try", timeout=60)
    assert "***" not in res.stderr and "NAME=VALUE" in res.stderr
    assert redact_text("internal error: KeyError: 'ts'") == "internal error: KeyError: 'ts'"
    assert redact_text("torch.TokenizerError: 'x'") == "torch.TokenizerError: 'x'"
    assert redact_text("KEY=abc --api-key s") == "KEY=*** --api-key ***"  # a job's still hidden
