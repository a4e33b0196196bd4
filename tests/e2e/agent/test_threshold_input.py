"""End to end: thresholds: each has a unit and range, `gpudiag thresholds` states them, bad values
are refused with one line and exit 2."""

from __future__ import annotations

import sys

from tests.conftest import gpudiag


def test_set_accepts_values_in_range(tmp_path):
    res = gpudiag(
        "run",
        "-q",
        "--set",
        "data_wait_warn=1",
        "--set",
        "min_loop_samples=10",
        "--format",
        "json",
        "--out",
        str(tmp_path / "r.json"),
        "--",
        sys.executable,
        "-c",
        "pass",
    )
    assert res.returncode == 0, res.stderr
    assert '"min_loop_samples": 10,' in res.stdout
