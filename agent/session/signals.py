"""Stopping on a signal: SIGINT (Ctrl-C), SIGTERM (`timeout`, schedulers) and SIGHUP (the
terminal closed) all stop profiling and the report is still written; a second one exits at
once, without the report.

SIGHUP ignored when gpudiag starts (`nohup gpudiag run ...`) stays ignored, as it does for
the job. The handler only sets a flag (no locks, no exceptions mid-report): the session's wait loop
sees it within 0.2 s. A second signal raises SystemExit(128 + signal), which unwinds through
the `finally` blocks (a half-written report's temporary file is removed).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """A context manager that turns the stop signals into a flag (see the module's note).

    `on_signal(signum, count)` runs in the handler before it returns or exits (e.g. passing
    the signal on to a launched job); it must not block.
    """

    def __init__(
        self,
        on_signal: Callable[[int, int], None] | None = None,
        signals: tuple[int, ...] = STOP_SIGNALS,
    ) -> None:
        self.signals = signals
        self.signum: int | None = None
        self.count = 0
        self.on_signal = on_signal
        self._old: dict[int, object] = {}

    @property
    def stopping(self) -> bool:
        """Whether a stop signal arrived."""
        return self.signum is not None

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.on_signal is not None:
            try:
                self.on_signal(signum, self.count)
            except Exception:
                pass
        if self.count == 1:
            self.signum = signum
            name = signal.Signals(signum).name
            os.write(
                2, f"gpudiag: {name}: stopping and writing the report (again: exit now)\n".encode()
            )
            return
        os.write(2, b"gpudiag: interrupted again: exiting now, without the report\n")
        raise SystemExit(128 + signum)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                if s == signal.SIGHUP and signal.getsignal(s) is signal.SIG_IGN:
                    continue  # `nohup gpudiag ...`: the user chose to outlive the terminal
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)  # type: ignore[arg-type]  # what signal() gave back before
        self._old.clear()
