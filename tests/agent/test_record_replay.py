"""--record writes the run; `gpudiag replay` gives the live run's findings back."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.output.recording import Recorder, open_recording, read_recording
from gpudiag.agent.output.report import RunInfo, build_report, validate
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
from gpudiag.probes.base import Sample, Target
from gpudiag.probes.gpu.nvml import Nvml
from gpudiag.probes.gpu.probe import GpuProbe
from tests.agent.test_e2e_workloads import loader_finding, same_as_replayed
from tests.conftest import WORKLOADS, gpudiag, gpudiag_until_sure
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
    assert [f["id"] for f in a["findings"]][0] == loader_finding(a)


def test_recording_round_trip_and_cut_short(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    r = Recorder(str(path), {"environment": {"host": "h"}, "run": {"pid": 1}}, layout="samples")
    samples = [Sample("host", i, {}, {"cpu_util": 0.5}) for i in range(10)]
    r.write(samples)
    r.close({"probes": [], "errors": [], "end_reason": "stopped"})
    rec, got = read_recording(str(path))
    assert got == samples and rec.footer["end_reason"] == "stopped"
    # a recording whose writer died (no footer, no gzip trailer) still replays
    cut = tmp_path / "cut.jsonl.gz"
    w = Recorder(str(cut), {"run": {"pid": 1}}, layout="samples")
    w.write(samples)
    w._f.flush()  # what reached the disk before the agent was killed
    rec, got = read_recording(str(cut))
    assert rec.footer is None and got == samples


def test_replay_rejects_what_is_not_a_recording(tmp_path, cli):
    bad = tmp_path / "x.jsonl.gz"
    bad.write_text("hello")
    res = cli("replay", str(bad))
    assert res.returncode == 2 and "not a gpudiag recording" in res.stderr
    other = tmp_path / "y.jsonl.gz"
    with gzip.open(other, "wt") as f:
        f.write('{"format": "something-else"}\n')
    res = cli("replay", str(other))
    assert res.returncode == 2 and "no header" in res.stderr


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


def _noisy(i: int) -> Sample:
    return Sample(
        "host",
        1_000_000_000 * i,
        {"cpu": str(i % 8)},
        {"core_util": (i * 7919 % 1000) / 1000.0, "x": float(i * 104729 % 99991)},
    )


def test_recording_is_bounded_by_rotation_and_replays_the_newest_part(tmp_path, cli):
    path = tmp_path / "long.jsonl.gz"
    r = Recorder(str(path), {"run": {"pid": 1}}, max_bytes=40_000, layout="samples")
    for i in range(0, 20_000, 100):
        r.write([_noisy(j) for j in range(i, i + 100)])
    r.close({"probes": [], "errors": [], "end_reason": "stopped"})
    older = tmp_path / "long.jsonl.gz.1"
    assert r.rotations >= 2 and older.exists()
    assert path.stat().st_size + older.stat().st_size <= 40_000 + 20_000  # one batch of slack
    rec, got = read_recording(str(path))
    assert rec.previous == str(older) and rec.footer["rotations"] == r.rotations
    assert got[-1] == _noisy(19_999)  # the newest samples are all there, in order
    assert got[0].t_ns > 0  # the oldest were dropped
    assert [s.t_ns for s in got] == sorted(s.t_ns for s in got)
    res = cli("replay", str(path), "--format", "json")
    assert res.returncode == 0, res.stderr


def test_replay_streams_the_file(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"format": "gpudiag-recording", "version": 1}) + "\n")
        for i in range(3):
            f.write(json.dumps(_noisy(i).to_dict()) + "\n")
        f.write('{"probe": "host"}\n')  # a broken line after three good ones
    rec = open_recording(str(path))  # reads the header only
    stream = rec.samples()
    assert [next(stream) for _ in range(3)] == [_noisy(i) for i in range(3)]
    with pytest.raises(UsageError, match="line 5 is not a sample"):
        next(stream)
