"""The launched job's stderr: shown as it comes, its last lines kept for a failure report.

The job writes into a pipe; a thread copies each chunk to gpudiag's stderr at once and keeps
the last few KiB. When gpudiag exits while the job keeps running (`--duration`), a keeper
takes over the pipe, so the job never writes into a pipe nobody reads: a small `sh` started
beside the job that holds the pipe's read end and waits on a lifeline only gpudiag holds. When
gpudiag closes it, or dies (SIGKILL, the OOM killer: no `close()` runs), the keeper becomes
`cat`, copying what the job writes to gpudiag's stderr (the job died of BrokenPipeError on its
next write, issue 53 N61).
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections import deque

from gpudiag.agent.base.safeio import create_stream
from gpudiag.probes.spawn import start_process
from gpudiag.text.redact import printable, redact_text

TAIL_BYTES = 8192
TAIL_LINES = 20
LINE_CHARS = 300
LOG_LINE_BYTES = 65536  # a job writing no newline (a progress bar) is cut into lines
PANEL_LINES = 1000  # lines kept for the UI's log panel between two refreshes
# the keeper: its stdin is the job's pipe, its stdout gpudiag's stderr, its stderr the
# lifeline's read end; it reads the lifeline to its end (gpudiag gone), then copies the pipe
KEEPER = "cat <&2 >/dev/null 2>&1; exec cat 2>/dev/null"


class StderrTee:
    """Copies a job's stderr pipe to fd 2 and remembers its tail. Under the terminal UI
    (`log_path`), the output goes to that file and to `take_lines()` (the UI's log panel)
    instead: nothing the job prints lands on the UI's screen. `keeper`: start the keeper
    (module note) that carries the pipe on if gpudiag dies."""

    def __init__(self, pipe: int, log_path: str | None = None, keeper: bool = True) -> None:
        self.fd = pipe
        self._tail: deque[bytes] = deque()
        self._size = 0
        self.log_path = log_path
        self._log = create_stream(log_path, "job log") if log_path else None
        self._pending: deque[str] = deque(maxlen=PANEL_LINES)
        self._partial = b""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._lifeline, self._keeper = start_keeper(pipe) if keeper else (-1, None)
        self._thread = threading.Thread(target=self._copy, name="gpudiag-job-stderr", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if not ready:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                os.close(self.fd)
                self.fd = -1
                return
            self._keep(chunk)
            if self._log is not None:
                self._to_panel(chunk)
                continue
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(2, view) :]
            except OSError:
                pass  # our stderr is gone; keep draining so the job never blocks

    def _to_panel(self, chunk: bytes) -> None:
        """Whole lines of the job's output to the log file (redacted) and the UI's panel
        (redacted, control characters stripped); a line is cut at LOG_LINE_BYTES."""
        with self._lock:
            text = self._partial + chunk
            *lines, self._partial = text.split(b"\n")
            if len(self._partial) > LOG_LINE_BYTES:
                lines.append(self._partial)
                self._partial = b""
            shown = [redact_text(ln.decode(errors="replace").rstrip("\r")) for ln in lines]
            self._pending.extend(printable(ln)[:LINE_CHARS] for ln in shown)
        self._write_log(shown)

    def _write_log(self, lines: list[str]) -> None:
        if not lines or self._log is None:
            return
        try:
            self._log.write("".join(ln + "\n" for ln in lines).encode("utf-8", "replace"))
            self._log.flush()
        except (OSError, ValueError):
            pass  # a full disk: the panel still shows it

    def take_lines(self) -> list[str]:
        """The job's output lines since the last call (for the UI's log panel)."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
            return out

    def _keep(self, chunk: bytes) -> None:
        self._tail.append(chunk)
        self._size += len(chunk)
        while self._size - len(self._tail[0]) >= TAIL_BYTES:
            self._size -= len(self._tail.popleft())

    def lines(self, wait_s: float = 1.0) -> list[str]:
        """The job's last stderr lines (waits briefly for what it wrote before it exited)."""
        self._thread.join(timeout=wait_s)
        text = b"".join(self._tail)[-TAIL_BYTES:].decode(errors="replace")
        lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
        return [ln[:LINE_CHARS] for ln in lines[-TAIL_LINES:]]

    def close(self) -> None:
        """Stop copying; if the job (or a child of it) still holds the pipe, the keeper (else
        a `cat`) carries on."""
        self._stop.set()
        self._thread.join(timeout=1.0)
        if self._log is not None and not self._thread.is_alive():
            if self._partial:
                self._write_log([redact_text(self._partial.decode(errors="replace"))])
            self._log.close()
        if self._lifeline >= 0:
            os.close(self._lifeline)  # the keeper takes over
            self._lifeline = -1
        if self.fd < 0 or self._thread.is_alive():
            self._reap()
            return
        if self._keeper is None:
            try:
                start_process(["cat"], stdin=self.fd, stdout=2, start_new_session=True)
            except OSError:
                pass
        os.close(self.fd)
        self.fd = -1

    def _reap(self) -> None:
        """The job's pipe is at its end: the keeper copies nothing and exits; wait for it."""
        if self._keeper is not None and self.fd < 0:
            try:
                self._keeper.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass  # a child of the job still holds the pipe: the keeper carries on


def start_keeper(pipe: int) -> tuple[int, subprocess.Popen | None]:
    """The lifeline's write end (-1 without a keeper) and the keeper holding `pipe`'s read
    end, in its own session (a ^C at the terminal is the job's to take, not the keeper's)."""
    life_r, life_w = os.pipe()  # not inherited by anything gpudiag starts later
    try:
        keeper = start_process(
            ["sh", "-c", KEEPER], stdin=pipe, stdout=2, stderr=life_r, start_new_session=True
        )
    except OSError:
        os.close(life_w)
        return -1, None
    finally:
        os.close(life_r)
    return life_w, keeper


def job_log_path(report: str | None) -> str:
    """Where `run --tui` writes the job's output: beside the report, `.job.log`."""
    if report:
        return (report[:-5] if report.endswith(".json") else report) + ".job.log"
    return time.strftime("gpudiag-job-%Y%m%d-%H%M%S.log")
