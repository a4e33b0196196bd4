"""End to end: the /metrics endpoint: job identity labels, the collector, and a scrape during a real
job."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from gpudiag.agent.base.config import Settings
from gpudiag.agent.fleet.metrics import LiveJob
from gpudiag.agent.fleet.server import MetricsServer, serve_job
from gpudiag.agent.output.report import load_report
from gpudiag.agent.session.live import live_doc
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.base import Target
from tests.agent.test_metrics import scrape
from tests.conftest import WORKLOADS, gpudiag, kill_left_job
from tests.job_findings import job_ids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = gpudiag(
            "run", "-q", "--metrics-port", str(port), "--", sys.executable, "-c", "print(1)"
        )
    assert res.returncode == 2
    assert res.stderr.startswith("gpudiag: error: cannot serve metrics on 127.0.0.1:")
    assert "Traceback" not in res.stderr
    res = gpudiag("run", "--metrics-addr", "not-an-ip", "--metrics-port", "0", "--", "true")
    assert res.returncode == 2 and "--metrics-addr" in res.stderr


def _job(seconds: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKLOADS / "starved_loader.py"), "--seconds", seconds],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_scrape_during_a_real_job_matches_its_report():
    pytest.importorskip("torch")
    proc = _job("40")
    opts = SessionOptions(duration_s=35, rate_hz=100, window_s=1.0, cpu_budget=None, progress=False)
    server = MetricsServer("127.0.0.1", 0, lambda: [])
    report = lambda: live_doc(session, "attach", ["python", "starved_loader.py"], proc.pid)  # noqa: E731
    job: LiveJob = serve_job(server, report, proc.pid, proc.args)
    settings = Settings(Thresholds(), (), None)
    parts = SessionParts(log=lambda m: None, sink=job.tap)
    session = Session(Target(proc.pid), settings, opts, parts)
    job.refresh_s = 0.0  # every scrape analyses afresh, so it is the report it was made from
    import threading

    worker = threading.Thread(target=session.run, daemon=True)
    worker.start()
    try:
        fams: dict = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(2)
            fams = scrape(server.url)
            if any(
                s.labels["severity"] != "note" for s in fams.get("gpudiag_finding_impact_ratio", [])
            ):
                break
        doc = job.last_doc
        assert doc is not None and doc["findings"], doc
        impact = {s.labels["finding"]: s for s in fams["gpudiag_finding_impact_ratio"]}
        speedups = fams["gpudiag_finding_expected_speedup_ratio"]
        speed = {s.labels["finding"]: s.value for s in speedups}
        assert set(impact) == {f["id"] for f in doc["findings"]}
        for f in doc["findings"]:
            assert impact[f["id"]].value == pytest.approx(f["impact"])
            assert impact[f["id"]].labels["severity"] == f["severity"]
            assert speed[f["id"]] == pytest.approx(f["expected_speedup"])
        top = job_ids(doc)[0]  # first among the job's causes (a busy box may add HOST002)
        assert top in ("DATA001", "DATA002")
        labels = impact[top].labels
        (info,) = [s.labels for s in fams["gpudiag_job_info"] if s.labels["job"] == labels["job"]]
        assert info["pid"] == str(proc.pid) and info["command"].endswith("--seconds 40")
        assert info["command"].startswith("python") and "/" not in info["command"]
        assert labels["user"] and labels["Hostname"]
        shares = {s.labels["category"]: s.value for s in fams["gpudiag_loop_share_ratio"]}
        assert shares["data_wait"] == pytest.approx(doc["breakdown"]["shares"]["data_wait"])
    finally:
        session.stop()
        worker.join(timeout=30)
        server.close()
        proc.kill()
        proc.wait()


@pytest.mark.long
def test_run_serves_metrics_while_the_job_runs(tmp_path):
    pytest.importorskip("torch")
    port, out = free_port(), tmp_path / "r.json"
    cmd = [sys.executable, "-m", "gpudiag.agent.cli.main", "run", "-q", "--metrics-port", str(port)]
    cmd += ["--cpu-budget", "0", "--window", "1", "--until-sure", "--duration", "20"]
    cmd += ["--out", str(out), "--", sys.executable, str(WORKLOADS / "starved_loader.py")]
    cmd += ["--seconds", "24"]
    # its stderr through a file: the job left running (--until-sure) keeps its copy open
    err = tmp_path / "gpudiag.stderr"
    with open(err, "w") as fe:
        gd = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fe)
    seen: set[str] = set()
    labels: dict = {}
    try:
        # scraped until a finding shows or gpudiag's look ends (40 scrapes, about 30 s, had
        # seen none at a load of 14 on 2 cores: the job's start-up alone took longer)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and gd.poll() is None:
            time.sleep(0.5 if not seen else 1.0)
            try:
                fams = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                continue
            for s in fams.get("gpudiag_finding_impact_ratio", []):
                seen.add(s.labels["finding"])
                labels = s.labels
            # the planted cause seen (a busy box's HOST002 may come first)
            if seen & {"DATA001", "DATA002"}:
                break
        # seen: SIGTERM stops the look and writes the report (gpudiag passes it on to the
        # job, whose status, 128 + 15, it exits with); a look already sure exits 0
        gd.send_signal(signal.SIGTERM)
        code = gd.wait(timeout=90)
        assert code in (0, 128 + signal.SIGTERM), err.read_text()
    finally:
        gd.kill()
        kill_left_job(err.read_text())
    run = load_report(str(out))["run"]
    assert run["pid"] and (code == 0 or run["end_reason"] == "interrupted"), run
    assert seen & {"DATA001", "DATA002"}, seen
    assert labels["user"] == _me() and labels["job"].startswith(f"{_me()}@")


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
