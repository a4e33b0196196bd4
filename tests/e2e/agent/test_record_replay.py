"""End to end: --record writes the run; `gpudiag replay` gives the live run's findings back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.output.report import RunInfo, build_report, validate
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
from gpudiag.probes.base import Target
from gpudiag.probes.gpu.nvml import Nvml
from gpudiag.probes.gpu.probe import GpuProbe
from tests.conftest import WORKLOADS, gpudiag, gpudiag_until_sure
from tests.e2e.agent.test_e2e_workloads import loader_finding, same_as_replayed
from tests.job_findings import job_ids
from tests.probes.fake_nvml import FakeGpu, FakeNvml


@pytest.mark.slow  # in the default suite: test_e2e_workloads.py's recorded run-mode look
def test_replay_of_a_live_run_gives_the_same_findings(tmp_path):
    pytest.importorskip("torch")
    rec, live, replayed = tmp_path / "run.jsonl.gz", tmp_path / "live.json", tmp_path / "r.json"
    res = gpudiag_until_sure(  # until the verdict is sure (a busy box takes longer)
        "run",
        "-q",
        "--until-sure",
        "--duration",
        "60",
        "--record",
        str(rec),
        "--out",
        str(live),
        "--",
        sys.executable,
        str(WORKLOADS / "starved_loader.py"),
        "--seconds",
        "65",
        tmp=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(live.read_text())["verdict"]["sure"], res.stderr
    assert f"Recording written to {rec}" in res.stdout
    res = gpudiag("replay", str(rec), "--out", str(replayed), "--format", "json")
    assert res.returncode == 0, res.stderr
    a, b = json.loads(live.read_text()), json.loads(replayed.read_text())
    same_as_replayed(a, b)
    assert job_ids(a)[0] == loader_finding(a)  # first among the job's causes


def test_gpu_lost_mid_run_is_recorded_and_the_report_still_written():
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
    try:
        fake = FakeNvml([FakeGpu(job_pids=[job.pid], lost_after_s=1.5)])
        session = Session(
            Target(job.pid),
            load_settings(None),
            SessionOptions(duration_s=3.5, progress=False),
            SessionParts(probes=[GpuProbe(Nvml(fake))], popen=None),
        )
        result = session.run()
    finally:
        job.kill()
        job.wait()
    assert any("lost" in e["message"] for e in result.errors)
    assert result.timeline.matching("gpu", "util_gpu", gpu="0")  # sampled before it was lost
    doc = build_report(
        analysis=result.analysis,
        run_info=RunInfo(
            "attach", None, job.pid, result.start, result.end, result.end_reason, None
        ),
        environment={"host": "h", "cpu_count": 1, "python": "3", **result.hardware},
        probes=result.probes,
        errors=result.errors,
        thresholds=load_settings(None).thresholds,
    )
    validate(doc)
    assert doc["environment"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
