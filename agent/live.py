"""Run a session behind the terminal UI: the session samples on a thread, the UI polls it."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable

from gpudiag.agent.report import report_of, write_report
from gpudiag.agent.session import Session, SessionResult
from gpudiag.agent.signals import StopSignals


def live_doc(
    session: Session, mode: str, command: list[str], pid: int, recent_s: float | None = None
) -> dict:
    """A report document of the session so far (with `recent_s`: of its last seconds)."""
    return report_of(
        session.result_so_far(recent_s),
        mode=mode,
        command=command,
        pid=pid,
        settings=session.settings,
    )


def run_with_tui(
    session: Session,
    mode: str,
    command: list[str],
    pid: int,
    out: str,
    preopened: dict | None = None,
    headless: bool = False,
    pass_on: Callable[[int, int], None] | None = None,
) -> SessionResult:
    """Show the live diagnosis until `q` (or the job ends and the user quits); SIGTERM or
    SIGHUP quit the UI the same way, so the report is still written (a second: at once),
    and are handed to `pass_on` (`run` passes them on to its job, as without the UI)."""
    from gpudiag.tui.app import DiagnosisApp
    from gpudiag.tui.feeds import Feed

    box: dict = {}

    def work() -> None:
        box["result"] = session.run(preopened)

    worker = threading.Thread(target=work, name="gpudiag-session", daemon=True)
    worker.start()

    def save() -> str:
        return str(write_report(live_doc(session, mode, command, pid), out))

    feed = Feed(
        f"{mode} pid {pid}",
        lambda: live_doc(session, mode, command, pid),
        live=True,
        save=save,
        pause=session.pause,
        stop=session.stop,
        capture=session.request_capture,
    )
    app = DiagnosisApp(feed)

    def quit_app(signum: int, count: int) -> None:
        if pass_on is not None:
            pass_on(signum, count)
        session.stop()
        if count == 1:  # from the handler: hand the exit to the UI's own event loop
            try:
                asyncio.get_running_loop().call_soon_threadsafe(app.exit)
            except RuntimeError:
                pass

    with StopSignals(quit_app, signals=(signal.SIGTERM, signal.SIGHUP)):
        app.run(headless=headless)
    session.stop()
    worker.join()
    return box["result"]
