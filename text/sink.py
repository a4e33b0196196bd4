"""The one way text leaves gpudiag for a terminal, a pipe or a log (issue 38): the text and
markdown summaries, the progress and status lines, `watch`'s log, `try`'s and `gate`'s lines.

Everything goes through `shown`: secrets hidden, escape sequences (ESC, OSC, CSI) and other
control characters removed. Multi-line text keeps its newlines; a status line (`say`) is one
line whatever its parts hold, so a newline in a job's argv cannot forge a log line.
`tests/test_choke_points.py` walks the package and fails on a `print` or a write to
stdout/stderr anywhere else.
"""

from __future__ import annotations

import sys
from typing import TextIO

from gpudiag.text.redact import printable, shown


def outbound(text: str, redact: bool = True) -> str:
    """Text fit to leave gpudiag: redacted (unless `redact` is False: a JSON document whose
    fields were redacted where they were made) and stripped of control characters, its
    newlines kept."""
    # (never cut: a rendered report is gpudiag's own document, as long as it is)
    return shown(text, lines=True, limit=None) if redact else printable(text, lines=True)


def emit(
    *parts: object,
    file: TextIO | None = None,
    end: str = "\n",
    sep: str = " ",
    flush: bool = False,
    redact: bool = True,
) -> None:
    """`print`, through `outbound` (stdout unless `file`)."""
    stream = file if file is not None else sys.stdout
    stream.write(outbound(sep.join(str(p) for p in parts), redact) + end)
    if flush:
        stream.flush()


def line(text: str) -> str:
    """One status line: redacted, controls removed, newlines made spaces."""
    return shown(str(text), lines=False)


def say(msg: str, prefix: str = "gpudiag: ", file: TextIO | None = None) -> None:
    """One status line on stderr (a progress line, a log line of `watch` or `try`)."""
    stream = file if file is not None else sys.stderr
    stream.write(f"{prefix}{line(msg)}\n")
    stream.flush()
