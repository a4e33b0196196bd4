"""End to end (slow): `gpudiag run` on the planted workloads of issue 39's new causes, beside a
process burning a core: each gets its own finding on top (HOST002 for the burner apart)."""

from __future__ import annotations

import sys

import pytest

from gpudiag.agent.output.report import load_report
from tests.agent.test_e2e_workloads import RUN_JOB_S, RUN_PROFILE_S, check
from tests.conftest import WORKLOADS, gpudiag_until_sure

pytest.importorskip("torch")

CASES = [
    ("eval_in_loop", "EVAL001"),
    ("oversubscribed_threads", "HOST003"),
    ("respawned_workers", "DATA003"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,expected", CASES, ids=[n for n, _ in CASES])
def test_run_names_the_planted_cause(name, expected, tmp_path, busy_core):
    out = tmp_path / "report.json"
    res = gpudiag_until_sure(
        "run",
        "-q",
        "--until-sure",
        "--duration",
        RUN_PROFILE_S,
        "--out",
        str(out),
        "--",
        sys.executable,
        str(WORKLOADS / f"{name}.py"),
        "--seconds",
        RUN_JOB_S,
        tmp=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    doc = load_report(str(out))
    assert doc["verdict"]["sure"], doc["verdict"]
    check(doc, expected)
    assert f"{expected} " in res.stdout and "Why: " in res.stdout
