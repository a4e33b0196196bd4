"""End to end: BentoML's quick-start service (tests/workloads/serve_bentoml.py), a second
server whose model runs in worker processes: the process started is BentoML's arbiter, which
binds the port and waits; its service worker takes the requests on the inherited socket and
runs the model. `attach ARBITER_PID` profiles the worker; under `run` and `attach --hooks` the
hooks count every request once against the client's, and SERVE001 names BentoML's batching.

BentoML is not in the test extra: it pins OpenTelemetry's SDK below what gpudiag's [otlp]
extra installs, and pulls some 25 packages; these tests skip where it is not installed
(`pip install bentoml` into a venv of your own to run them)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag.agent.session.targets import choose_target
from tests.conftest import WORKLOADS, hooks_cannot_load
from tests.e2e.agent.test_serving_e2e import CLI, client_said, load_procs, p50_as_said

pytest.importorskip("torch")
pytest.importorskip("bentoml", reason="BentoML is not installed (pip install bentoml)")


def start(tmp: Path, seconds: float = 60.0, *flags: str) -> tuple[subprocess.Popen, Path]:
    """serve_bentoml.py once its worker is ready (its port written)."""
    port = tmp / "port"
    server = subprocess.Popen(
        [sys.executable, str(WORKLOADS / "serve_bentoml.py"), "--seconds", str(seconds)]
        + ["--port-file", str(port), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while not port.exists():
        assert time.time() < deadline and server.poll() is None, "BentoML did not start"
        time.sleep(0.2)
    return server, port


def stop(server: subprocess.Popen) -> None:
    """The arbiter stopped as Ctrl-C stops it (it stops its workers, which run in sessions of
    their own and outlive a killed arbiter), then every process left killed."""
    import psutil

    try:
        kids = psutil.Process(server.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    server.send_signal(2)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=10)
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass


def load(port: Path, out: Path) -> subprocess.Popen:
    """4 client processes for 8 s, the tokens as one row a request (the API's input)."""
    return load_procs(port, out, 8, "--rows")


def test_attach_profiles_bentomls_service_worker_not_its_arbiter(tmp_path):
    server, _ = start(tmp_path)
    try:
        choice = choose_target(server.pid)
    finally:
        stop(server)
    roles = {r.pid: r.role for r in choice.roles}
    assert choice.root == server.pid and roles[server.pid] == "front end"
    # the worker takes the requests on the socket it inherited and runs the model: the loop,
    # with the hooks loaded into it alone (the arbiter answers no request)
    assert choice.pid != server.pid and roles[choice.pid] == "model worker"
    assert "takes the requests on the shared socket" in next(
        r.what for r in choice.roles if r.pid == choice.pid
    )
    assert choice.serving == ()


def _as_said(doc: dict, client: Path) -> None:
    """The kind, the rate and p50 within 10% of the client's (issue 54; the p50 allowing for
    the client's own wait for a CPU), SERVE001 with BentoML's own batching, no bound from a
    process that waits, and which process does what."""
    said, m = client_said(client), doc["metrics"]
    assert doc["workload"]["kind"] == "server"
    assert m["requests_per_second"] == pytest.approx(said.rate, rel=0.10)
    p50_as_said(m["request_latency_p50_s"], said)
    serve001 = next(f for f in doc["findings"] if f["id"] == "SERVE001")
    if doc["breakdown"]["samples"]:  # BentoML is told from its frames in the loop window's
        # stacks (a `run` at load 8 with a 30 s look had none there)
        assert serve001["recommendation"]["actions"][0].startswith(
            "BentoML: @bentoml.api(batchable=True, max_batch_size="
        )
    assert "LOOP001" not in {f["id"] for f in doc["findings"] if f["severity"] != "note"}
    roles = {p["role"] for p in doc["run"]["processes"]}
    assert {"front end", "model worker"} <= roles


@pytest.mark.slow
def test_run_counts_bentomls_requests_once_and_names_its_batching(tmp_path):
    port, report, out = tmp_path / "port", tmp_path / "r.json", tmp_path / "gpudiag.out"
    cmd = [*CLI, "run", "-q", "--duration", "16", "--out", str(report), "--"]
    server = [sys.executable, str(WORKLOADS / "serve_bentoml.py"), "--seconds", "45"]
    with open(out, "w") as f:
        agent = subprocess.Popen([*cmd, *server, "--port-file", str(port)], stdout=f, stderr=f)
    client = load(port, tmp_path / "client.txt")
    assert client.wait(timeout=180) == 0
    assert agent.wait(timeout=180) == 0, out.read_text()
    doc = json.loads(report.read_text())
    _as_said(doc, tmp_path / "client.txt")
    assert doc["run"]["pid"] == next(
        p["pid"] for p in doc["run"]["processes"] if p["role"] == "front end"
    )


@pytest.mark.slow
def test_attach_with_the_hooks_reads_bentomls_requests_in_its_worker(tmp_path):
    if hooks_cannot_load():
        pytest.skip(f"attach --hooks needs pyinjector or gdb: {hooks_cannot_load()}")
    server, port = start(tmp_path, seconds=90)
    report, err = tmp_path / "r.json", tmp_path / "gpudiag.err"
    try:
        cmd = [*CLI, "attach", str(server.pid), "--hooks", "--duration", "20"]
        with open(err, "w") as f:
            agent = subprocess.Popen([*cmd, "--out", str(report)], stdout=f, stderr=f)
        deadline = time.time() + 120
        while "attached to pid" not in err.read_text():
            assert time.time() < deadline and agent.poll() is None, err.read_text()
            time.sleep(0.1)
        client = load(port, tmp_path / "client.txt")
        assert client.wait(timeout=60) == 0
        assert agent.wait(timeout=120) == 0, err.read_text()
    finally:
        stop(server)
    doc = json.loads(report.read_text())
    assert doc["run"]["pid"] != server.pid  # the service worker is the loop's process
    _as_said(doc, tmp_path / "client.txt")


@pytest.mark.slow
def test_an_idle_bentoml_server_gets_no_warning(tmp_path):
    server, _ = start(tmp_path, seconds=60)
    report, err = tmp_path / "r.json", tmp_path / "gpudiag.err"
    try:
        cmd = [*CLI, "attach", str(server.pid), "--duration", "10", "--out", str(report)]
        with open(err, "w") as f:
            assert subprocess.run(cmd, stdout=f, stderr=f, timeout=120).returncode == 0
    finally:
        stop(server)
    doc = json.loads(report.read_text())
    assert [f["id"] for f in doc["findings"] if f["severity"] != "note"] == []


@pytest.mark.slow
def test_plain_attach_names_bentomls_batching_from_the_kernels_connections(tmp_path):
    """Plain attach (no hooks): BentoML's sync API runs the model on its pool thread while
    the requests wait on the event loop, on no thread's stack; the kernel's connections count
    them in flight, and SERVE001 is named, not sure, with BentoML's own batching first."""
    server, port = start(tmp_path, seconds=90)
    report, err = tmp_path / "r.json", tmp_path / "gpudiag.err"
    try:
        cmd = [*CLI, "attach", str(server.pid), "--duration", "18", "--out", str(report)]
        with open(err, "w") as f:
            agent = subprocess.Popen(cmd, stdout=f, stderr=f)
        time.sleep(3)
        client = load(port, tmp_path / "client.txt")
        assert client.wait(timeout=60) == 0
        assert agent.wait(timeout=120) == 0, err.read_text()
    finally:
        stop(server)
    doc = json.loads(report.read_text())
    m = doc["metrics"]
    assert doc["workload"]["kind"] == "server" and m["pool_forward_est"] > 0
    assert m["connections_in_flight"] > 0
    serve001 = next(f for f in doc["findings"] if f["id"] == "SERVE001")
    assert serve001["confidence"] < 0.9 and serve001["signals"] == ["stacks"]
    assert serve001["recommendation"]["actions"][0].startswith(
        "BentoML: @bentoml.api(batchable=True, max_batch_size="
    )
    assert doc["verdict"]["sure"] is False
