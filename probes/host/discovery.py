"""Finding the jobs on a box for `gpudiag watch`: processes NVML lists on a GPU, and Python
processes that have PyTorch loaded (libtorch in /proc/PID/maps), without their own children
(DataLoader workers load libtorch too), gpudiag itself, or its children. And whether
DCGM (dcgm-exporter or nv-hostengine) runs on the box, whose profiling module NVML GPM
conflicts with."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

DCGM_NAMES = ("dcgm-exporter", "nv-hostengine")
DCGM_NOTE = "NVML GPM conflicts with DCGM's profiling module: SM and tensor activity not sampled"
DCGM_HINT = (
    "read SM and tensor activity from dcgm-exporter's DCGM_FI_PROF_* metrics; they join "
    "gpudiag's on the UUID and Hostname labels"
)
PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    """What discovery needs to know of one process."""

    pid: int
    ppid: int
    name: str
    cmdline: tuple[str, ...]


def read_proc(pid: int, root: Path = PROC) -> ProcInfo | None:
    """One process's name, parent and command line (None when it is gone or unreadable)."""
    try:
        stat = (root / str(pid) / "stat").read_text()
        raw = (root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    args = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
    return ProcInfo(pid, ppid, name, args)


def list_processes(root: Path = PROC) -> list[ProcInfo]:
    """Every readable process now."""
    out = []
    for entry in root.iterdir():
        if entry.name.isdigit():
            info = read_proc(int(entry.name), root)
            if info is not None:
                out.append(info)
    return out


def has_torch(pid: int, root: Path = PROC) -> bool:
    """Whether the process has libtorch mapped (PyTorch imported)."""
    try:
        with open(root / str(pid) / "maps", errors="replace") as f:
            return any("libtorch" in line for line in f)
    except OSError:
        return False


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
            or (_is_python(p) and not ancestor_in(p.pid, known) and torch_check(p.pid))
        )
    }
    return sorted(pid for pid in found if not ancestor_in(pid, found))


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
