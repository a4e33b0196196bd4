"""The one place gpudiag starts a process (issue 53): the launched job, `try`'s arms, py-spy,
gdb, the hooks' loader, the stderr keeper. tests/test_choke_points.py fails on a process
started anywhere else.

What is started is an argv list of strings, never a shell line (no `shell=True`), and never a
binary named through /proc (`/proc/PID/exe` is the job's own binary: gpudiag running as root
ran another user's interpreter to learn its version, which ran that user's code as root).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from typing import Any


class SpawnRefused(OSError):
    """A process gpudiag will not start (its argv says why)."""


def checked(argv: Sequence[str]) -> list[str]:
    """`argv` as a list; SpawnRefused when it is not a non-empty list of strings, or names
    its program through /proc."""
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise SpawnRefused(f"not an argv list of strings: {str(argv)[:80]!r}")
    program = os.path.abspath(argv[0]) if "/" in argv[0] else argv[0]  # a bare name: PATH's
    if program.startswith("/proc/"):
        raise SpawnRefused(f"refused to run {argv[0]!r}: a binary named through /proc")
    return list(argv)


def _options(kw: dict[str, Any]) -> dict[str, Any]:
    if kw.get("shell"):
        raise SpawnRefused("refused: a shell line (shell=True)")
    if "executable" in kw:
        raise SpawnRefused("refused: a program other than argv[0] (executable=)")
    return kw


def start_process(argv: Sequence[str], **kw: Any) -> subprocess.Popen:
    """subprocess.Popen of a checked argv (its keyword arguments as Popen's)."""
    return subprocess.Popen(checked(argv), **_options(kw))


def run_process(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
    """subprocess.run of a checked argv (its keyword arguments as run's)."""
    return subprocess.run(checked(argv), **_options(kw))
