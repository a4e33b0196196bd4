"""Whether the watched pid is still the job (not exited, not a zombie, not replaced by another
program with `exec`, not a new process that reused the number), and which probes hang."""

from __future__ import annotations

import os
import time


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


class HangWatch:
    """Which probes' calls have run past `limit_s`: such a probe is hung; its thread (a
    daemon) is left behind, the other probes keep their own cadence."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.busy: dict[str, float] = {}  # probe name -> when its current call started
        self.hung: set[str] = set()

    def begin(self, name: str) -> float:
        """A call of probe `name` starts now (its start time)."""
        self.busy[name] = t = time.monotonic()
        return t

    def end(self, name: str) -> None:
        """The call returned."""
        self.busy.pop(name, None)

    def overdue(self) -> list[str]:
        """Probes newly found hung (each named once)."""
        now = time.monotonic()
        late = [
            n for n, t in list(self.busy.items()) if n not in self.hung and now - t > self.limit_s
        ]
        self.hung.update(late)
        return late
