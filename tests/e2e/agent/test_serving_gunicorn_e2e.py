"""End to end: `gpudiag run -- gunicorn ...` and `gpudiag attach MASTER_PID` on the planted
Flask model server under gunicorn's workers (sync and gthread, two processes forked by the
master: the hooks time their requests in each worker), and the FastAPI one under uvicorn's
and gunicorn's ASGI workers, with the load generator on 127.0.0.1: the workload's kind, the
request rate and latency against the client's, the planted causes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from tests.conftest import WORKLOADS
from tests.e2e.agent.test_serving_e2e import (
    CLI,
    MODEL_IDS,
    Said,
    client_said,
    ids,
    latency_as_said,
    load,
)

pytest.importorskip("torch")
pytest.importorskip("gunicorn")
pytestmark = pytest.mark.slow

# gunicorn's workers: their options, the app, and the module they need
WORKERS = {
    "sync": (["-w", "2"], "serve_flask:app", "flask"),
    "gthread": (["-w", "2", "-k", "gthread", "--threads", "2"], "serve_flask:app", "flask"),
    "gevent": (["-w", "2", "-k", "gevent"], "serve_flask:app", "gevent"),
    "uvicorn": (
        ["-w", "2", "-k", "uvicorn.workers.UvicornWorker"],
        "serve_fastapi:app",
        "uvicorn.workers",
    ),
    # gunicorn's own ASGI worker (in recent gunicorn; skipped where absent)
    "asgi": (["-w", "2", "-k", "asgi"], "serve_fastapi:app", "gunicorn.asgi.protocol"),
}


def gunicorn(kind: str) -> list[str]:
    """gunicorn serving serve_flask's or serve_fastapi's app with `kind` workers
    (serve_gunicorn.py's config); skips where the worker's module is not installed."""
    options, app, needs = WORKERS[kind]
    if app.startswith("serve_fastapi"):
        pytest.importorskip("fastapi")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # uvicorn.workers says it is
        pytest.importorskip(needs)
    config = str(WORKLOADS / "serve_gunicorn.py")
    return [sys.executable, "-m", "gunicorn", "-c", config, *options, app]


def server_env(port: Path, seconds: int, instrument: bool = False) -> dict[str, str]:
    env = dict(os.environ, SERVE_PORT_FILE=str(port), SERVE_SECONDS=str(seconds))
    env.pop("SERVE_ARGS", None)
    if instrument:
        env["SERVE_INSTRUMENT"] = "1"
    else:
        env.pop("SERVE_INSTRUMENT", None)
    return env


def assert_planted(doc: dict, said: Said, rel: float, host_at_threshold: bool = False) -> None:
    """The kind, rate and latency against the client's, SERVE001 and INFER001; no SERVE002
    or LOOP001 (`host_at_threshold`: SERVE002 allowed, the gevent workers' own per-request
    work putting the request path's host share at 30-36%, at its threshold)."""
    assert doc["workload"]["kind"] == "server" and doc["workload"]["unit"] == "request"
    assert doc["workload"]["basis"] == "requests seen by the hooks"
    m = doc["metrics"]
    assert m["requests_per_second"] == pytest.approx(said.rate, rel=rel), (m["requests"], said)
    latency_as_said(m, said)
    assert m["forward_batch_p50"] == 1 and m["forward_grad_share"] == 1
    assert MODEL_IDS <= ids(doc)
    # the master supervising its workers is neither the request path nor unexplained time
    banned = {"LOOP001"} if host_at_threshold else {"SERVE002", "LOOP001"}
    assert not banned & ids(doc), doc["findings"]


@pytest.mark.parametrize("kind", sorted(WORKERS))
def test_run_on_gunicorn_times_its_workers_requests(tmp_path, kind):
    """`gpudiag run -- gunicorn ...`: the hooks, installed in the master at its start, are
    forked into its workers; each worker's requests reach the agent (their pids merged), the
    rate within 10% of the client's and the latency inside its view, SERVE001 and INFER001.
    Flask under the sync, gthread and gevent workers (gunicorn's own request entry points
    patched), FastAPI under uvicorn's gunicorn worker (uvicorn's patches, in each worker) and
    gunicorn's own ASGI worker."""
    port, report = tmp_path / "port", tmp_path / "r.json"
    cmd = [*CLI, "run", "-q", "--duration", "24", "--out", str(report), "--", *gunicorn(kind)]
    with open(tmp_path / "gpudiag.out", "w") as f:
        agent = subprocess.Popen(cmd, stdout=f, stderr=f, env=server_env(port, 26))
    client = load(port, tmp_path / "client.txt", seconds=8.0)
    assert client.wait(timeout=120) == 0
    assert agent.wait(timeout=120) == 0, (tmp_path / "gpudiag.out").read_text()
    doc = json.loads(report.read_text())
    assert_planted(
        doc, client_said(tmp_path / "client.txt"), rel=0.10, host_at_threshold=kind == "gevent"
    )


def test_attach_to_gunicorns_master_with_instrument(tmp_path):
    """The master called instrument() (in its config): `gpudiag attach MASTER_PID` binds the
    master's socket, and the workers' hooks (forked from the master's) send there, finding
    none at their own pid's. The load starts once gpudiag is attached."""
    port, report, err = tmp_path / "port", tmp_path / "r.json", tmp_path / "gpudiag.err"
    server = subprocess.Popen(
        gunicorn("sync"), stdout=subprocess.DEVNULL, env=server_env(port, 60, instrument=True)
    )
    try:
        deadline = time.time() + 90
        while not port.exists():
            assert time.time() < deadline and server.poll() is None
            time.sleep(0.1)
        cmd = [*CLI, "attach", str(server.pid), "--duration", "14", "--out", str(report)]
        with open(tmp_path / "gpudiag.out", "w") as out, open(err, "w") as f:
            agent = subprocess.Popen(cmd, stdout=out, stderr=f)
        while "attached to pid" not in err.read_text():
            assert time.time() < deadline + 60, err.read_text()
            time.sleep(0.1)
        client = load(port, tmp_path / "client.txt", seconds=8)
        assert client.wait(timeout=60) == 0
        assert agent.wait(timeout=120) == 0, err.read_text()
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    doc = json.loads(report.read_text())
    assert_planted(doc, client_said(tmp_path / "client.txt"), rel=0.05)
