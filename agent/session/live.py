"""Run a session behind the terminal UI: the session samples on a thread, the UI polls it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from gpudiag.agent.output.report import report_of, write_report
from gpudiag.agent.session.session import Session, SessionResult, Subject
from gpudiag.agent.session.signals import StopSignals


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


class JobView:
    """The launched job as `run --tui` shows it: its output lines, how it ended, and the
    interrupt `q` sends (SIGINT, what Ctrl-C sends it under `run`)."""

    def __init__(self, popen: subprocess.Popen, output: Any, output_path: str | None) -> None:
        self.popen = popen
        self.output = output
        self.output_path = output_path
        self._ended: str | None = None

    def interrupt(self) -> None:
        """Send the job SIGINT, as a terminal's Ctrl-C does under `run`."""
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, signal.SIGINT)
            except OSError:
                pass

    def ended(self) -> str | None:
        """'job exited 0 at 21:04:05', 'job killed by SIGINT at ...'; None while it runs."""
        if self._ended is None:
            code = self.popen.poll()
            if code is None:
                return None
            how = f"exited {code}" if code >= 0 else f"killed by {signal_name(-code)}"
            self._ended = f"job {how} at {time.strftime('%H:%M:%S')}"
        return self._ended


def signal_name(num: int) -> str:
    """SIGINT for 2, else the number."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def run_with_tui(
    session: Session,
    subject: Subject,
    preopened: dict | None = None,
    headless: bool = False,
    pass_on: Callable[[int, int], None] | None = None,
    job: JobView | None = None,
) -> SessionResult:
    """Show the live diagnosis until `q` (or the job ends and the user quits); SIGTERM or
    SIGHUP quit the UI the same way, so the report is still written (a second: at once),
    and are handed to `pass_on` (`run` passes them on to its job, as without the UI).
    With `job` (run --tui), the job's output goes to the log panel, `q` ends the job as
    Ctrl-C does under `run`, and the header says when and how the job ended."""
    from gpudiag.tui.app import DiagnosisApp
    from gpudiag.tui.feeds import Feed

    mode, command, pid, out = subject.mode, subject.command, subject.pid, subject.out
    box: dict = {}

    def work() -> None:
        box["result"] = session.run(preopened)

    worker = threading.Thread(target=work, name="gpudiag-session", daemon=True)
    worker.start()

    def save() -> str:
        return str(write_report(live_doc(session, mode, command, pid), out))

    def stop() -> None:
        if job is not None:
            job.interrupt()
        session.stop()

    feed = Feed(
        f"{mode} pid {pid}",
        lambda: live_doc(session, mode, command, pid),
        live=True,
        save=save,
        pause=session.pause,
        stop=stop,
        capture=session.request_capture,
        output=job.output if job is not None else None,
        output_path=job.output_path if job is not None else None,
        ended=job.ended if job is not None else None,
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
