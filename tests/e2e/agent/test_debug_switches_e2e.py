"""End to end: a CPU training job that left autograd's anomaly detection on is DEBUG001 in
`run` (the hooks read the switch) and in `attach` (the stacks alone); the fixed job is not.
The fix's effect is measured by `gpudiag try --fix anomaly_off` (tests/agent/test_try.py) and
benchmarks/anomaly_cost.py."""

from __future__ import annotations

import sys

import pytest

from gpudiag.agent.output.report import load_report
from tests.conftest import WORKLOADS, gpudiag, gpudiag_until_sure, start_training
from tests.job_findings import job_ids

pytest.importorskip("torch")
JOB = str(WORKLOADS / "anomaly_train.py")


def _debug001(doc: dict) -> dict | None:
    return next((f for f in doc["findings"] if f["id"] == "DEBUG001"), None)


@pytest.mark.parametrize("off", [False, True], ids=["left-on", "off"])
def test_run_names_anomaly_detection_left_on_and_not_when_off(off, tmp_path):
    out = tmp_path / "report.json"
    res = gpudiag_until_sure(
        "run",
        "-q",
        "--duration",
        "10",
        "--out",
        str(out),
        "--",
        sys.executable,
        JOB,
        "--seconds",
        "14",
        *(["--off"] if off else []),
        tmp=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    doc = load_report(str(out))
    found = _debug001(doc)
    if off:
        assert found is None, found
        return
    assert found is not None and job_ids(doc)[0] == "DEBUG001", doc["findings"]
    assert "hooks" in found["signals"] and found["fix"]["kind"] == "anomaly_off"
    assert found["speedup_kind"] == "hypothesis" and found["speedup_low"] > 1.0


def test_attach_sees_it_in_the_stacks_alone(tmp_path):
    out = tmp_path / "report.json"
    job = start_training([JOB, "--seconds", "40"], tmp_path / "ready")
    try:
        res = gpudiag(
            "attach", str(job.pid), "-q", "--duration", "12", "--out", str(out), timeout=120
        )
    finally:
        job.kill()
        job.wait()
    assert res.returncode == 0, res.stderr
    found = _debug001(load_report(str(out)))
    assert found is not None and found["signals"] == ["stacks"], found
