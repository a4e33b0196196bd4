"""--record writes every sample; `gpudiag replay` gives the live run's findings back."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from gpudiag.agent.config import load_settings
from gpudiag.agent.recording import Recorder, read_recording
from gpudiag.agent.report import build_report, validate
from gpudiag.agent.session import Session, SessionOptions
from gpudiag.probes.base import Sample, Target
from gpudiag.probes.gpu import GpuProbe
from gpudiag.probes.nvml import Nvml
from tests.agent.test_e2e_workloads import loader_finding
from tests.conftest import WORKLOADS, gpudiag
from tests.probes.fake_nvml import FakeGpu, FakeNvml


def test_replay_of_a_live_run_gives_the_same_findings(tmp_path):
    pytest.importorskip("torch")
    rec, live, replayed = tmp_path / "run.jsonl.gz", tmp_path / "live.json", tmp_path / "r.json"
    res = gpudiag("run", "-q", "--duration", "12", "--record", str(rec), "--out", str(live),
                  "--", sys.executable, str(WORKLOADS / "starved_loader.py"), "--seconds", "15")
    assert res.returncode == 0, res.stderr
    assert f"Recording written to {rec}" in res.stdout
    res = gpudiag("replay", str(rec), "--out", str(replayed), "--format", "json")
    assert res.returncode == 0, res.stderr
    a, b = json.loads(live.read_text()), json.loads(replayed.read_text())
    assert [f["id"] for f in a["findings"]] == [f["id"] for f in b["findings"]]
    assert [f["id"] for f in a["findings"]][0] == loader_finding(a)
    assert a["breakdown"]["shares"] == pytest.approx(b["breakdown"]["shares"], abs=1e-6)
    assert b["run"]["mode"] == "replay" and b["probes"] == a["probes"]


def test_recording_round_trip_and_cut_short(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    r = Recorder(str(path), {"environment": {"host": "h"}, "run": {"pid": 1}})
    samples = [Sample("host", i, {}, {"cpu_util": 0.5}) for i in range(10)]
    r.write(samples)
    r.close({"probes": [], "errors": [], "end_reason": "stopped"})
    rec = read_recording(str(path))
    assert rec.samples == samples and rec.footer["end_reason"] == "stopped"
    # a recording whose writer died (no footer, no gzip trailer) still replays
    cut = tmp_path / "cut.jsonl.gz"
    w = Recorder(str(cut), {"run": {"pid": 1}})
    w.write(samples)
    w._f.flush()  # what reached the disk before the agent was killed
    rec = read_recording(str(cut))
    assert rec.footer is None and rec.samples == samples


def test_replay_rejects_what_is_not_a_recording(tmp_path):
    bad = tmp_path / "x.jsonl.gz"
    bad.write_text("hello")
    res = gpudiag("replay", str(bad))
    assert res.returncode == 2 and "not a gpudiag recording" in res.stderr
    other = tmp_path / "y.jsonl.gz"
    with gzip.open(other, "wt") as f:
        f.write('{"format": "something-else"}\n')
    res = gpudiag("replay", str(other))
    assert res.returncode == 2 and "no header" in res.stderr


def test_gpu_lost_mid_run_is_recorded_and_the_report_still_written():
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(20)"])
    try:
        fake = FakeNvml([FakeGpu(job_pids=[job.pid], lost_after_s=1.5)])
        session = Session(Target(job.pid), load_settings(None),
                          SessionOptions(duration_s=3.5, progress=False),
                          probes=[GpuProbe(Nvml(fake))], popen=None)
        result = session.run()
    finally:
        job.kill()
        job.wait()
    assert any("lost" in e["message"] for e in result.errors)
    assert result.timeline.matching("gpu", "util_gpu", gpu="0")  # sampled before it was lost
    doc = build_report(analysis=result.analysis, mode="attach", command=None, pid=job.pid,
                       start=result.start, end=result.end, end_reason=result.end_reason,
                       exit_code=None, environment={"host": "h", "cpu_count": 1,
                                                    "python": "3", **result.hardware},
                       probes=result.probes, errors=result.errors,
                       thresholds=load_settings(None).thresholds)
    validate(doc)
    assert doc["environment"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
