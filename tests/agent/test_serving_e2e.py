"""End to end: `gpudiag run` and `gpudiag attach` on the planted model server with its load
generator (127.0.0.1), and on the batch-embedding job: the workload's kind, the request rate
against the client's, the planted causes, and none on the fixed variants."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import WORKLOADS

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "gpudiag.agent.cli.main"]
MODEL_IDS = {"SERVE001", "INFER001"}


def load(port_file: Path, out: Path, seconds: float = 10.0) -> subprocess.Popen:
    """The load generator: 4 clients back to back for `seconds`, its summary in `out`."""
    args = ["--port-file", str(port_file), "--clients", "4", "--seconds", str(seconds)]
    with open(out, "w") as f:
        return subprocess.Popen(
            [sys.executable, str(WORKLOADS / "load_gen.py"), *args, "--delay", "1"], stdout=f
        )


def client_rate(out: Path) -> float:
    m = re.search(r"([\d.]+) req/s", out.read_text())
    assert m, out.read_text()
    return float(m.group(1))


def run_server(
    tmp: Path, *server_args: str, script: str = "serve_http.py", whole: bool = False
) -> tuple[dict, float]:
    """`gpudiag run` on the server while the load runs: the report and the client's rate.
    `whole`: a shorter load that ends well inside gpudiag's look (the same requests counted
    by both ends, not two windows of a rate that drifts on a busy box)."""
    port, report = tmp / "port", tmp / "r.json"
    look, serve, secs = ("24", "26", 8.0) if whole else ("14", "15", 10.0)
    cmd = [*CLI, "run", "-q", "--duration", look, "--out", str(report), "--"]
    server = [sys.executable, str(WORKLOADS / script), "--seconds", serve]
    with open(tmp / "gpudiag.out", "w") as f:
        agent = subprocess.Popen(
            [*cmd, *server, "--port-file", str(port), *server_args], stdout=f, stderr=f
        )
    client = load(port, tmp / "client.txt", seconds=secs)
    assert client.wait(timeout=120) == 0
    assert agent.wait(timeout=120) == 0, (tmp / "gpudiag.out").read_text()
    return json.loads(report.read_text()), client_rate(tmp / "client.txt")


def ids(doc: dict) -> set[str]:
    return {f["id"] for f in doc["findings"]}


def test_run_names_the_server_its_request_rate_and_both_planted_causes(tmp_path):
    doc, rate = run_server(tmp_path)
    assert doc["workload"]["kind"] == "server" and doc["workload"]["unit"] == "request"
    assert MODEL_IDS <= ids(doc)
    m = doc["metrics"]
    assert m["requests_per_second"] == pytest.approx(rate, rel=0.10)
    assert m["forward_batch_p50"] == 1 and m["forward_grad_share"] == 1
    assert "request handlers" in doc["breakdown"]["thread"]


@pytest.mark.parametrize("fixed", [False, True])
def test_run_on_a_fastapi_server_as_its_docs_write_one(tmp_path, fixed):
    """FastAPI under uvicorn, one forward per request (the docs' style): the ASGI hooks count
    the requests the clients sent (within 2%), and the planted causes are named; with
    inference mode INFER001 goes."""
    pytest.importorskip("fastapi")
    args = ["--inference-mode"] if fixed else []
    doc, rate = run_server(tmp_path, *args, script="serve_fastapi.py", whole=True)
    assert doc["workload"]["kind"] == "server" and doc["workload"]["unit"] == "request"
    m = doc["metrics"]
    said = (tmp_path / "client.txt").read_text()
    assert m["requests_per_second"] == pytest.approx(rate, rel=0.02), (m["requests"], said)
    assert m["forward_batch_p50"] == 1 and m["requests_in_flight_max"] >= 2
    assert "SERVE001" in ids(doc)
    assert ("INFER001" in ids(doc)) is not fixed


def test_run_on_the_healthy_server_raises_nothing_about_the_model(tmp_path):
    doc, rate = run_server(tmp_path, "--healthy")
    assert doc["workload"]["kind"] == "server"
    assert not (MODEL_IDS | {"SERVE002"}) & ids(doc)
    assert doc["metrics"]["forward_batch_p50"] > 1
    assert doc["metrics"]["requests_per_second"] == pytest.approx(rate, rel=0.10)


def test_run_names_a_tokenizer_on_the_request_path(tmp_path):
    """The model path fixed (batched, inference mode), the handlers tokenizing in Python."""
    doc, _ = run_server(tmp_path, "--healthy", "--tokenize")
    top = doc["findings"][0]
    assert top["id"] == "SERVE002" and top["location"].endswith(":tokenize")
    assert not MODEL_IDS & ids(doc)


@pytest.mark.parametrize("script", ["serve_http.py", "serve_fastapi.py"])
def test_attach_to_the_instrumented_server_names_the_planted_causes(tmp_path, script):
    """attach to a server that called instrument(): the standard library's, and FastAPI's
    under uvicorn (its modules imported before instrument() patches them)."""
    if script == "serve_fastapi.py":
        pytest.importorskip("fastapi")
    port, report = tmp_path / "port", tmp_path / "r.json"
    server = subprocess.Popen(
        [sys.executable, str(WORKLOADS / script), "--seconds", "40"]
        + ["--port-file", str(port), "--instrument"],
        stdout=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    try:
        deadline = time.time() + 60
        while not port.exists() and time.time() < deadline:
            time.sleep(0.1)
        client = load(port, tmp_path / "client.txt", seconds=16)
        res = subprocess.run(
            [*CLI, "attach", str(server.pid), "-q", "--duration", "14", "--out", str(report)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        assert client.wait(timeout=60) == 0
    finally:
        server.kill()
        server.wait()
    doc = json.loads(report.read_text())
    assert doc["workload"]["kind"] == "server"
    assert MODEL_IDS <= ids(doc)
    assert doc["metrics"]["requests_per_second"] == pytest.approx(
        client_rate(tmp_path / "client.txt"), rel=0.15
    )


@pytest.mark.parametrize("fixed", [False, True])
def test_run_on_the_batch_embedding_job(tmp_path, fixed):
    report = tmp_path / "r.json"
    job = [sys.executable, str(WORKLOADS / "batch_embed.py"), "--seconds", "12"]
    res = subprocess.run(
        [*CLI, "run", "-q", "--duration", "11", "--out", str(report), "--", *job]
        + (["--inference-mode"] if fixed else []),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(report.read_text())
    assert doc["workload"]["kind"] == "inference" and doc["workload"]["unit"] == "batch"
    assert ("INFER001" in ids(doc)) is not fixed
    assert doc["metrics"]["forward_batch_p50"] == 16


@pytest.mark.parametrize("util", [3, 80])
def test_an_idle_gpu_under_a_fastapi_server_is_serve003_under_fake_nvml(tmp_path, util):
    """A real FastAPI server's run recorded (one client at a time: nothing to batch, inference
    mode on), then the fake NVML layer's GPU held by its pid added to the same span: idle 97%
    is SERVE003 with the idle money a day, and nothing about the model; busy 80% is not."""
    pytest.importorskip("fastapi")
    from gpudiag.agent.output.recording import open_recording
    from gpudiag.analyzers import analyze
    from gpudiag.probes.base import Target
    from gpudiag.probes.gpu.nvml import Nvml
    from gpudiag.probes.gpu.probe import GpuProbe
    from tests.probes.fake_nvml import FakeGpu, FakeNvml, const
    from tests.probes.test_gpu_probe import Clock

    port, rec = tmp_path / "port", tmp_path / "run.jsonl.gz"
    cmd = [*CLI, "run", "-q", "--duration", "16", "--record", str(rec), "--"]
    server = [sys.executable, str(WORKLOADS / "serve_fastapi.py"), "--seconds", "18"]
    agent = subprocess.Popen(
        [*cmd, *server, "--port-file", str(port), "--inference-mode"], stdout=subprocess.DEVNULL
    )
    args = ["--port-file", str(port), "--clients", "1", "--seconds", "6", "--delay", "1"]
    client = subprocess.run(
        [sys.executable, str(WORKLOADS / "load_gen.py"), *args], capture_output=True, timeout=120
    )
    assert client.returncode == 0 and agent.wait(timeout=120) == 0
    recording = open_recording(str(rec))
    tl, pid = recording.timeline(), recording.header["run"]["pid"]
    gpu = FakeGpu(job_pids=[pid], util=const(util), job_mem=const(6 * 2**30))
    clock = Clock()
    clock.t = (tl.start_ns - 1_000_000_000_000) / 1e9
    probe = GpuProbe(Nvml(FakeNvml([gpu], clock=clock)), clock_ns=clock.ns)
    assert probe.open(Target(pid)).available
    while clock.ns() < tl.end_ns:
        clock.t += 1.0
        tl.extend(probe.sample())
    a = analyze(tl)
    found = {f.id: f for f in a.findings}
    assert a.workload.kind == "server"
    assert not MODEL_IDS & set(found)
    if util > 50:
        assert "SERVE003" not in found
        return
    f = found["SERVE003"]
    assert f.cost and f.cost["usd_per_day"] > 0 and "a day pays for idle GPU time" in f.message
    assert {e.metric: e.value for e in f.evidence}["gpu_idle_share"] >= 0.9
