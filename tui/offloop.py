"""Work the event loop must not wait for (an analysis, NVML and the process table), run on a
worker thread one call at a time; the result is handed back on the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import App


class OffLoop:
    """`request()` starts `fetch` on a worker thread unless one is running (never queued);
    `done(result)` runs on the event loop when it returns (None when it raised)."""

    def __init__(self, app: App, fetch: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.app, self.fetch, self.done = app, fetch, done
        self.busy = False

    def request(self) -> None:
        if self.busy:
            return
        self.busy = True
        self.app.run_worker(self._work, thread=True, exit_on_error=False)

    def _work(self) -> None:
        result = None
        try:
            result = self.fetch()
        finally:
            try:
                self.app.call_from_thread(self._done, result)
            except RuntimeError:  # the app is closing
                self.busy = False

    def _done(self, result: Any) -> None:
        self.busy = False
        self.done(result)
