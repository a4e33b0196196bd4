"""Run a session behind the terminal UI: the session samples on a thread, the UI polls it."""

from __future__ import annotations

import threading
import time

from gpudiag.agent.environment import describe_environment
from gpudiag.agent.report import build_report, write_report
from gpudiag.agent.session import Session, SessionResult
from gpudiag.probes.base import ProbeStatus


def live_doc(session: Session, mode: str, command: list[str], pid: int) -> dict:
    """A report document of the session so far."""
    analysis = session.snapshot()
    probes = [session.statuses.get(p.name) or ProbeStatus(p.name, False, "starting")
              for p in session.probes]
    return build_report(analysis=analysis, mode=mode, command=command, pid=pid,
                        start=session.start_time, end=time.time(), end_reason="stopped",
                        exit_code=session.exit_code, environment=describe_environment(pid),
                        probes=probes, errors=list(session.errors),
                        thresholds=session.settings.thresholds,
                        settings_source=session.settings.source,
                        agent=session.governor.summary() if session.governor else None)


def run_with_tui(session: Session, mode: str, command: list[str], pid: int, out: str,
                 preopened: dict | None = None) -> SessionResult:
    """Show the live diagnosis until `q` (or the job ends and the user quits)."""
    from gpudiag.tui.app import DiagnosisApp
    from gpudiag.tui.feeds import Feed

    box: dict = {}

    def work() -> None:
        box["result"] = session.run(preopened)

    worker = threading.Thread(target=work, name="gpudiag-session", daemon=True)
    worker.start()

    def save() -> str:
        return str(write_report(live_doc(session, mode, command, pid), out))

    feed = Feed(f"{mode} pid {pid}", lambda: live_doc(session, mode, command, pid), live=True,
                save=save, pause=session.pause, stop=session.stop)
    DiagnosisApp(feed).run()
    session.stop()
    worker.join()
    return box["result"]
