"""A model server whose model runs in worker processes (LitServe's inference workers, BentoML's
runners, vLLM's engine core): which process of the tree under the PID the user named does
what. The process named takes the HTTP requests or only waits for its workers; the model runs
in a descendant that holds torch and does not listen.

Read from procfs only: the tree's Python processes, the TCP sockets they listen on (a forked
HTTP process shares its front end's listening socket), whether each has libtorch mapped, and
the NVIDIA devices each holds open (its GPU).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import psutil

from gpudiag.probes.host.discovery import has_torch


@dataclass(frozen=True)
class Role:
    """One process of a server and what it does there."""

    pid: int
    role: str  # "front end", "listener", "model worker", "helper"
    what: str  # in words: "listens on 127.0.0.1:8000", "holds torch, 12.3 s of CPU"

    def to_dict(self) -> dict:
        """The report's form."""
        return {"pid": self.pid, "role": self.role, "what": self.what}


@dataclass(frozen=True)
class ServerProcesses:
    """A front end and its workers: the model workers busiest first, the processes that share
    its listening socket (those that take its HTTP requests, and any helper forked after the
    bind, as LitServe's queue manager is), and every process's role."""

    front: int
    model: tuple[int, ...]
    http: tuple[int, ...]
    roles: tuple[Role, ...]

    def words(self) -> str:
        """'pid 10 (front end: waits); pid 12 (model worker: ...)'."""
        return "; ".join(f"pid {r.pid} ({r.role}: {r.what})" for r in self.roles)


def listening(proc: psutil.Process) -> set[tuple[str, int]]:
    """The TCP addresses `proc` listens on (a socket it inherited included)."""
    try:
        conns = proc.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return set()
    return {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}


def _python(proc: psutil.Process) -> bool:
    try:
        return proc.name().startswith("python") or "python" in proc.exe().rsplit("/", 1)[-1]
    except (psutil.Error, OSError):
        return False


def cpu_s(proc: psutil.Process) -> float:
    """User plus system CPU seconds of `proc` (-1 when gone)."""
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return -1.0
    return t.user + t.system


def _addr(addrs: set[tuple[str, int]]) -> str:
    return ", ".join(f"{ip}:{port}" for ip, port in sorted(addrs))


def server_processes(pid: int) -> ServerProcesses | None:
    """The roles of `pid`'s tree when it is a server whose model runs in worker processes: the
    tree listens on a TCP port, and a Python descendant holds torch: one that does not share
    that socket (it takes no request itself: LitServe's inference worker), else one that
    takes the requests on the socket it inherited (BentoML's service worker under its
    arbiter). None otherwise (a process that serves and runs its model itself, with no
    torch-holding descendant; a job that is not a server). The caller decides whether `pid`
    only waits (a supervisor: the worker is the job) or does its own work."""
    try:
        front = psutil.Process(pid)
        kids = [k for k in front.children(recursive=True) if _python(k)]
    except psutil.Error:
        return None
    mine = listening(front)
    heard = {k.pid: listening(k) for k in kids}
    addrs = mine.union(*heard.values())
    if not addrs or not kids:
        return None
    http = [k for k in kids if heard[k.pid] & addrs]
    torch_kids = [k for k in kids if has_torch(k.pid)]
    # the model's own processes: those that take no request, else those that serve it too
    torch_kids = [k for k in torch_kids if k not in http] or torch_kids
    if not torch_kids:
        return None
    spent = {k.pid: cpu_s(k) for k in kids}
    model = sorted(torch_kids, key=lambda k: -spent[k.pid])
    roles = [Role(pid, "front end", _front_words(mine, http) + _gpu_words(pid))]
    roles += [Role(k.pid, "model worker", _worker_words(k, heard, spent)) for k in model]
    roles += [
        Role(k.pid, "listener", f"shares the listening socket {_addr(heard[k.pid])}")
        for k in http
        if k not in model
    ]
    roles += [
        Role(k.pid, "helper", f"neither listens nor holds torch ({_cmd(k)})")
        for k in kids
        if k not in http and k not in model
    ]
    return ServerProcesses(
        pid, tuple(k.pid for k in model), tuple(k.pid for k in http), tuple(roles)
    )


def roles_of(pid: int) -> list[dict] | None:
    """The report's `run.processes` for `pid`'s server (its processes and their roles), None
    where `pid` is no server whose model runs in worker processes or is gone."""
    procs = server_processes(pid)
    return [r.to_dict() for r in procs.roles] if procs is not None else None


NVIDIA_DEV_RE = re.compile(r"^/dev/nvidia(\d+)$")


def gpu_devices(pid: int, proc: str = "/proc") -> tuple[int, ...]:
    """The NVIDIA devices `pid` holds open (/dev/nvidiaN among its file descriptors: a CUDA
    context opens the device of each GPU it uses), by device minor number; () where none or
    unreadable."""
    fds = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return ()
    found: set[int] = set()
    for name in names:
        try:
            m = NVIDIA_DEV_RE.match(os.readlink(f"{fds}/{name}"))
        except OSError:
            continue
        if m:
            found.add(int(m.group(1)))
    return tuple(sorted(found))


def _gpu_words(pid: int) -> str:
    devs = gpu_devices(pid)
    if not devs:
        return ""
    return ", on GPU " + ", ".join(f"{d} (/dev/nvidia{d})" for d in devs)


def _worker_words(
    k: psutil.Process, heard: dict[int, set[tuple[str, int]]], spent: dict[int, float]
) -> str:
    took = (
        f", takes the requests on the shared socket {_addr(heard[k.pid])}" if heard[k.pid] else ""
    )
    return f"holds torch{_gpu_words(k.pid)}{took}, {spent[k.pid]:.1f} s of CPU"


def _front_words(mine: set[tuple[str, int]], http: list[psutil.Process]) -> str:
    if mine and http:
        return f"listens on {_addr(mine)}, shared with pid " + ", ".join(str(k.pid) for k in http)
    return f"listens on {_addr(mine)}" if mine else "waits on its workers"


def _cmd(proc: psutil.Process) -> str:
    try:
        words = " ".join(proc.cmdline())
    except psutil.Error:
        return "?"
    return words if len(words) <= 60 else words[:57] + "..."
