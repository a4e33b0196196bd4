"""Whether the watched pid is still the job: not exited, not a zombie, not replaced by
another program (`exec`), and not a new process that reused the number after the job ended."""

from __future__ import annotations

import os


def identity(pid: int) -> tuple[str | None, str | None]:
    """(start time in clock ticks since boot, executable) of a pid; None where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            start: str | None = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = None
    try:
        exe: str | None = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        exe = None
    return start, exe


def running(pid: int) -> bool:
    """Whether the pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class TargetWatch:
    """Remembers a pid's identity when profiling starts; `changed()` says what became of it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start, self.exe = identity(pid)

    def changed(self) -> str | None:
        """Why the pid is no longer the job (reused, or exec'd another program), else None."""
        start, exe = identity(self.pid)
        if self.start is not None and start is not None and start != self.start:
            return (
                f"pid {self.pid} ended and its number was reused by another process "
                f"({exe or 'unknown program'}); profiling stopped"
            )
        if self.exe and exe and exe != self.exe:
            return (
                f"pid {self.pid} replaced its program (exec) with {exe}: it is no longer "
                "the Python job; profiling stopped"
            )
        return None
