"""End to end: `gpudiag gate`: verdicts and exit codes on saved reports and on real runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import WORKLOADS, gpudiag


@pytest.mark.slow  # about 70 s: five real runs; the gate's logic is tested on scripted runs
def test_real_runs_baseline_pass_and_planted_slowdown(tmp_path):
    pytest.importorskip("torch")
    base = str(tmp_path / "baseline.json")
    job = [sys.executable, str(WORKLOADS / "healthy.py"), "--seconds", "5"]
    report = ("--out", str(tmp_path / "g.json"))

    def gate(*args: str) -> subprocess.CompletedProcess:
        return gpudiag("gate", "--baseline", base, "--runs", "3", "-q", *args, timeout=300)

    res = gate("--update-baseline", "--", *job)
    assert res.returncode == 0, res.stderr
    assert len(json.loads(open(base).read())["runs"]) == 3
    res = gate(*report, "--", *job)
    assert res.returncode in (0, 3), res.stdout + res.stderr  # never a regression
    res = gate(*report, "--", *job, "--data-delay", "0.15")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION steps_per_second" in res.stdout
