"""What the TUI shows comes from a feed: a saved report, a replayed recording or a live
session. A feed hands out report documents (the same JSON the agent writes), so the TUI
never imports probes, NVML, psutil or torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Feed:
    """A source of report documents. `snapshot()` is called about once a second."""

    title: str
    snapshot: Callable[[], dict | None]
    live: bool = False
    save: Callable[[], str] | None = None  # write the report now; returns the path
    pause: Callable[[bool], None] | None = None  # pause/resume sampling
    stop: Callable[[], None] | None = None  # end the session (q)
    capture: Callable[[], str] | None = None  # ask the job for a profiler capture (c)
    output: Callable[[], list[str]] | None = None  # the job's new output lines (run --tui)
    output_path: str | None = None  # the file the job's output also goes to
    ended: Callable[[], str | None] | None = None  # how and when the job ended; None: runs


def static_feed(doc: dict, title: str) -> Feed:
    """A feed over one finished report."""
    return Feed(title, lambda: doc)
