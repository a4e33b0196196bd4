"""`gpudiag try`: a trial never writes over the job's outputs, inside the job.

Runs inside each arm of a trial (as it is, and with the fix) and imports nothing from gpudiag.
GPUDIAG_TRY_GUARD holds {"since": the trial's start (epoch seconds), "folders": [the job's
folders]}. A write to a file under those folders that was there before the trial started (its
last change older than `since`: a checkpoint, a results file, a log of an earlier run) is
refused: the arm's step log gets a "# refused: ..." line and the call raises PermissionError,
so nothing is written. Files the trial's own arms made (or a diagnosis run by `try` made) are
newer than `since` and written as usual. Watched: open() / io.open() for writing or appending,
os.open() with a write flag, os.replace() / os.rename() onto a file, torch.save() to a path.
Dot folders (.cache, .git), __pycache__ and lock files are left alone.
"""

from __future__ import annotations

import builtins
import io
import os
from collections.abc import Callable
from typing import Any

GUARD_ENV = "GPUDIAG_TRY_GUARD"
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC


def _writes(mode: object) -> bool:
    return isinstance(mode, str) and any(c in mode for c in "wax+")


class Guard:
    """The job's folders and the trial's start; `note` writes a line to the step log."""

    def __init__(self, since: float, folders: list[str], note: Callable[[str], None]) -> None:
        self.since = since
        self.folders = [os.path.realpath(f) for f in folders if f and f != os.sep]
        self.note = note

    def over(self, path: object) -> str | None:
        """The file `path` names when writing it would write over the job's output."""
        if isinstance(path, int) or not isinstance(path, (str, bytes, os.PathLike)):
            return None
        try:
            full = os.path.realpath(os.fsdecode(path))
            st = os.stat(full)
        except (OSError, ValueError, TypeError):
            return None  # a new file: not the job's output from before the trial
        if not os.path.isfile(full) or st.st_mtime >= self.since:
            return None
        if not any(full == f or full.startswith(f.rstrip(os.sep) + os.sep) for f in self.folders):
            return None
        parts = full.split(os.sep)
        if any(p.startswith(".") or p == "__pycache__" for p in parts[:-1]):
            return None
        if full.endswith((".lock", ".pyc")):
            return None
        return full

    def check(self, path: object, what: str) -> None:
        """Refuse (PermissionError, and the step log told) a write over the job's output."""
        full = self.over(path)
        if full is None:
            return
        self.note(
            f"# refused: the job {what} {full}, a file it had before this trial: trials never "
            "write over the job's outputs; point its outputs at a scratch folder for the "
            "trial (or move the file) and try again"
        )
        raise PermissionError(13, f"gpudiag try: refused to write over {full}")


def install(torch: Any, since: float, folders: list[str], note: Callable[[str], None]) -> Guard:
    """Patch the calls that write files so they ask the guard first."""
    guard = Guard(since, folders, note)
    orig_open = builtins.open

    def open_(file, mode="r", *args, **kwargs):
        if _writes(mode):
            guard.check(file, "opens for writing")
        return orig_open(file, mode, *args, **kwargs)

    builtins.open = open_
    io.open = open_
    orig_os_open = os.open

    def os_open(path, flags, *args, **kwargs):
        if flags & WRITE_FLAGS:
            guard.check(path, "opens for writing")
        return orig_os_open(path, flags, *args, **kwargs)

    os.open = os_open
    for name in ("replace", "rename"):
        orig_move = getattr(os, name)

        def move(src, dst, *args, _orig=orig_move, **kwargs):
            guard.check(dst, "moves a file over")
            return _orig(src, dst, *args, **kwargs)

        setattr(os, name, move)
    orig_save = torch.save

    def save(obj, f, *args, **kwargs):
        guard.check(f, "saves (torch.save) over")
        return orig_save(obj, f, *args, **kwargs)

    torch.save = save
    return guard
