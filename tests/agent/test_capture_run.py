"""`gpudiag run --capture-steps N`: the capture's summary lands in the report, the HTML page
and the Chrome trace."""

from __future__ import annotations

import sys


def test_capture_steps_without_hooks_is_a_usage_error(tmp_path, cli):
    res = cli("run", "--no-inject", "--capture-steps", "3", "--", sys.executable, "-c", "pass")
    assert res.returncode == 2
    assert "needs the in-process hooks" in res.stderr and res.stderr.count("\n") == 1


def test_capture_steps_must_be_positive(cli):
    res = cli("run", "--capture-steps", "0", "--", sys.executable, "-c", "pass")
    assert res.returncode == 2 and "1..1000" in res.stderr
