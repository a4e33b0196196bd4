"""Signals around the launch: a SIGTERM while `run` starts the job still gets the report, a job
dead before the last look is reaped and reported, `gate` stops on SIGTERM with no baseline."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def test_a_job_dead_before_the_last_look_is_reaped_and_reported():
    """A SIGKILLed job seen dead by its pid before poll() reaped it gave exit 0 and no error."""
    import os
    import signal
    import subprocess

    from gpudiag.agent.base.config import load_settings
    from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
    from gpudiag.probes.base import Target

    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(popen.pid, signal.SIGKILL)
    os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped

    class LatePoll:  # poll() ran just before the job died
        pid = popen.pid

        def poll(self):
            return None

        def wait(self, timeout=None):
            return popen.wait(timeout)

    parts = SessionParts(probes=[], popen=LatePoll(), log=lambda m: None)
    s = Session(Target(popen.pid), load_settings(None, cwd=Path("/")), SessionOptions(), parts)
    assert not s.target_alive()
    assert s.exit_code == -signal.SIGKILL
    assert any("killed by SIGKILL" in e["message"] for e in s.errors)


def test_gate_stops_on_sigterm_and_writes_no_baseline(tmp_path):
    """`gate` kept going after SIGTERM (each run's session took it as the end of that run)
    and wrote its baseline."""
    import signal
    import subprocess
    import time

    marker, base = tmp_path / "started", tmp_path / "base.json"
    job = f"import time; open({str(marker)!r}, 'a').write('x'); time.sleep(30)"
    cmd = [sys.executable, "-m", "gpudiag.agent.cli.main", "gate", "--baseline", str(base)]
    cmd += ["--update-baseline", "--runs", "3", "--duration", "20", "--", sys.executable, "-c", job]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the session is sampling the first run
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and not base.exists()
    assert marker.read_text() == "x"  # no second run was started


class _Killed(Exception):
    """Stands for SIGTERM's default action (gpudiag killed) in an in-process test."""


def test_a_sigterm_while_run_starts_the_job_still_gets_the_report(tmp_path, monkeypatch):
    """A SIGTERM after `run` started the job and before its handlers were installed killed
    gpudiag with no report and orphaned the job."""
    import os
    import signal

    from gpudiag.agent.cli.main import main
    from gpudiag.agent.commands import run as run_mod

    real_launch = run_mod.launch

    def launch_then_term(*a, **kw):
        job = real_launch(*a, **kw)
        started.append(job.popen)
        os.kill(os.getpid(), signal.SIGTERM)  # in the window between the two
        return job

    def killed(signum, frame):
        raise _Killed()

    started: list = []
    monkeypatch.setattr(run_mod, "launch", launch_then_term)
    old = signal.signal(signal.SIGTERM, killed)
    out = tmp_path / "r.json"
    try:
        rc = main(["run", "-q", "--no-inject", "--out", str(out), "--", sys.executable, "-c",
                   "import time; time.sleep(60)"])  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, old)
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert rc == 128 + signal.SIGTERM  # the job got the SIGTERM too: its status passed through
    assert started[0].returncode == -signal.SIGTERM
    assert json.loads(out.read_text())["run"]["end_reason"] in ("interrupted", "target_exited")
