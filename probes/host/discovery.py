"""Finding the jobs on a box for `gpudiag watch`: processes NVML lists on a GPU, and Python
processes that have PyTorch loaded (libtorch in /proc/PID/maps), without their own children
(DataLoader workers load libtorch too), gpudiag itself, or its children. And whether
DCGM (dcgm-exporter or nv-hostengine) runs on the box, whose profiling module NVML GPM
conflicts with.

What discovery reads of each process every poll is bounded: its stat line, at most
MAX_CMDLINE_BYTES of its command line (what `--match` and the job's label see), and, for a
Python process not watched yet, at most MAX_MAPS_BYTES of its memory map, re-read at most every
MAPS_RECHECK_S (a process that imports torch later is found that much later)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpudiag.probes.files import read_head

DCGM_NAMES = ("dcgm-exporter", "nv-hostengine")
DCGM_NOTE = "NVML GPM conflicts with DCGM's profiling module: SM and tensor activity not sampled"
DCGM_HINT = (
    "read SM and tensor activity from dcgm-exporter's DCGM_FI_PROF_* metrics; they join "
    "gpudiag's on the UUID and Hostname labels"
)
PROC = Path("/proc")
MAX_CMDLINE_BYTES = 16 * 1024  # of one process's command line, each poll
MAX_STAT_BYTES = 4096
MAX_MAPS_BYTES = 2 * 1024 * 1024  # of one process's memory map, per look for libtorch
MAPS_RECHECK_S = 30.0  # how soon a Python process without torch is looked at again


@dataclass(frozen=True)
class ProcInfo:
    """What discovery needs to know of one process."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]
    start: int = 0  # its start time (clock ticks after boot): a pid's next process differs


def read_proc(pid: int, root: Path = PROC) -> ProcInfo | None:
    """One process's name, parent, start time and command line (its first
    MAX_CMDLINE_BYTES); None when it is gone or unreadable."""
    try:
        stat = read_head(root / str(pid) / "stat", MAX_STAT_BYTES).decode(errors="replace")
        raw = read_head(root / str(pid) / "cmdline", MAX_CMDLINE_BYTES)
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        ppid, start = int(fields[1]), int(fields[19]) if len(fields) > 19 else 0
    except (OSError, ValueError, IndexError):
        return None
    args = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    return ProcInfo(pid, ppid, name, args, start)


def list_processes(root: Path = PROC) -> list[ProcInfo]:
    """Every readable process now."""
    out = []
    for entry in root.iterdir():
        if entry.name.isdigit():
            info = read_proc(int(entry.name), root)
            if info is not None:
                out.append(info)
    return out


def cpu_s(pid: int, root: Path = PROC) -> float:
    """A process's user and system CPU seconds (-1 when it cannot be read)."""
    try:
        stat = read_head(root / str(pid) / "stat", MAX_STAT_BYTES).decode(errors="replace")
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return -1.0


def cpu_share(pid: int, root: Path = PROC) -> float:
    """The share of one core a process has used since it started (its CPU seconds over its
    age; -1 when it cannot be read): one read of its stat, no second look needed."""
    try:
        stat = read_head(root / str(pid) / "stat", MAX_STAT_BYTES).decode(errors="replace")
        fields = stat.rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        uptime = float(read_head(root / "uptime", 64).split()[0])
        age = uptime - int(fields[19]) / tick
        return (int(fields[11]) + int(fields[12])) / tick / age if age > 0 else 0.0
    except (OSError, ValueError, IndexError):
        return -1.0


def has_torch(pid: int, root: Path = PROC) -> bool:
    """Whether the process has libtorch mapped (PyTorch imported), in the first
    MAX_MAPS_BYTES of its memory map."""
    try:
        return b"libtorch" in read_head(root / str(pid) / "maps", MAX_MAPS_BYTES)
    except OSError:
        return False


class TorchCheck:
    """has_torch with a memory: a process found with torch is not read again, and one found
    without it is read again only after MAPS_RECHECK_S (processes are told apart by their
    start time, so a reused pid is read anew)."""

    def __init__(
        self,
        procs: Callable[[int], ProcInfo | None] = read_proc,
        check: Callable[[int], bool] = has_torch,
        recheck_s: float = MAPS_RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._procs, self._check, self.recheck_s, self._clock = procs, check, recheck_s, clock
        self._seen: dict[int, tuple[int, bool, float]] = {}  # pid -> (start, torch, when)

    def __call__(self, pid: int, start: int | None = None) -> bool:
        if start is None:
            info = self._procs(pid)
            start = info.start if info is not None else 0
        now = self._clock()
        got = self._seen.get(pid)
        if got is not None and got[0] == start and (got[1] or now - got[2] < self.recheck_s):
            return got[1]
        found = self._check(pid)
        if len(self._seen) > 65536:
            self._seen.clear()
        self._seen[pid] = (start, found, now)
        return found


def _is_python(p: ProcInfo) -> bool:
    exe = os.path.basename(p.cmdline[0]) if p.cmdline else ""
    return p.name.startswith("python") or exe.startswith("python")


def find_jobs(
    procs: Iterable[ProcInfo],
    gpu_pids: Iterable[int] = (),
    torch_check: Callable[[int], bool] = has_torch,
    me: int | None = None,
    match: re.Pattern[str] | None = None,
    known: Iterable[int] = (),
) -> list[int]:
    """The root pids of the jobs on the box: GPU processes and Python processes with torch,
    less any process whose parent is one of them, gpudiag (`me`) and its children, and, with
    `match`, those whose command line does not match. `known` jobs (already watched) and
    their children are not read again."""
    me = os.getpid() if me is None else me
    by_pid = {p.pid: p for p in procs}
    gpu, known = set(gpu_pids), set(known)

    def ancestor_in(pid: int, pids: set[int]) -> bool:
        seen = set()
        parent = by_pid[pid].ppid if pid in by_pid else 0
        while parent and parent not in seen:
            if parent in pids:
                return True
            seen.add(parent)
            parent = by_pid[parent].ppid if parent in by_pid else 0
        return False

    found = {
        p.pid
        for p in by_pid.values()
        if p.pid != me
        and p.ppid != me
        and (match is None or match.search(" ".join(p.cmdline)))
        and (
            p.pid in gpu
            or p.pid in known
            or (_is_python(p) and not ancestor_in(p.pid, known) and _torch(torch_check, p))
        )
    }
    return sorted(pid for pid in found if not ancestor_in(pid, found))


def _torch(check: Callable[[int], bool], p: ProcInfo) -> bool:
    return check(p.pid, p.start) if isinstance(check, TorchCheck) else check(p.pid)


def dcgm_process(procs: Iterable[ProcInfo] | None = None) -> ProcInfo | None:
    """A running dcgm-exporter or nv-hostengine (by process name), or None."""
    for p in list_processes() if procs is None else procs:
        exe = os.path.basename(p.cmdline[0]) if p.cmdline else ""
        if p.name in DCGM_NAMES or exe in DCGM_NAMES or p.name.startswith("dcgm-exporter"):
            return p
    return None


def dcgm_running() -> str | None:
    """'dcgm-exporter (pid N)' or 'nv-hostengine (pid N)' when one runs, else None."""
    p = dcgm_process()
    return None if p is None else f"{p.name} (pid {p.pid})"
