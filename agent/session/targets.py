"""Which processes `attach PID` profiles, and why.

The PID the user names is profiled when it is a Python process (with the other ranks of its
job when it is one rank). A process that is not Python is taken as a launcher only when it
may be one: not init, not a container's PID 1, not a shell leading its own session, not
another user's process; and only the ranks below it that run as its own user are taken.
Anything else is bad input (exit 2): gpudiag never profiles a job the user did not name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import psutil

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.fleet.identity import other_user
from gpudiag.agent.session.workers import Role, server_processes
from gpudiag.analyzers.measures.workload import SERVER_FILE_RE, SUPERVISOR_FILE_RE
from gpudiag.probes.dist.ranks import RankInfo, find_ranks, rank_process, sibling_ranks
from gpudiag.probes.servers.triton import SERVER_NAME, STUB_NAME
from gpudiag.probes.stacks.dump import dump_main_stack

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish", "tcsh", "csh", "ash", "busybox"})


@dataclass(frozen=True)
class AttachChoice:
    """The processes `attach` profiles: the primary pid, the job's ranks, and why."""

    pid: int
    ranks: list[RankInfo]
    root: int
    why: str
    roles: tuple[Role, ...] = ()  # a server's processes and what each does (its model workers)
    serving: tuple[int, ...] = ()  # the other processes of a server whose hooks count requests


def _uid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def _is_python(pid: int) -> bool:
    try:
        return os.path.basename(psutil.Process(pid).exe()).startswith("python")
    except (psutil.Error, OSError):
        return False


def container_init(pid: int) -> bool:
    """Whether `pid` is PID 1 of its own PID namespace (a container's init)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return line.split()[-1] == "1"
    except OSError:
        pass
    return False


def session_leader_shell(pid: int) -> bool:
    """Whether `pid` is a shell that leads its own session (a login or terminal shell)."""
    try:
        return os.getsid(pid) == pid and _name(pid) in SHELLS
    except OSError:
        return False


def not_a_launcher(pid: int, me: int | None = None) -> str | None:
    """Why `pid` may not be taken as a launcher (None when it may)."""
    me = os.geteuid() if me is None else me
    if pid == 1:
        return "it is init (PID 1)"
    if container_init(pid):
        return "it is a container's PID 1"
    if session_leader_shell(pid):
        return f"it is a shell leading its own session ({_name(pid)})"
    uid = _uid(pid)
    if uid is None:
        return "it cannot be read"
    if me != 0 and uid != me:
        return f"it belongs to another user (uid {uid})"
    return None


def own_ranks(ranks: list[RankInfo], uid: int | None) -> list[RankInfo]:
    """The ranks that run as `uid` (a rank of another user's job is never taken)."""
    return [r for r in ranks if uid is not None and _uid(r.pid) == uid]


def _rank_words(ranks: list[RankInfo]) -> str:
    return ", ".join(f"rank {r.rank} pid {r.pid}" for r in ranks)


def choose_target(pid: int) -> AttachChoice:
    """The processes `attach PID` profiles, or UsageError when PID names no Python job."""
    theirs = other_user(pid)  # another user's process cannot even be read: say that first
    if theirs is not None:
        raise UsageError(f"cannot attach: {theirs}")
    uid = _uid(pid)
    name = _name(pid)
    if name == SERVER_NAME:
        return triton_choice(pid)
    if _is_python(pid):
        ranks = own_ranks(sibling_ranks(pid), uid)
        if not ranks:
            served = supervised_server(pid)
            if served is not None:
                child, where = served
                why = (
                    f"pid {pid} ({name}) only supervises its child pid {child} ({where}), "
                    f"which does the work: pid {child} profiled"
                )
                return AttachChoice(child, [], pid, why)
            workers = worker_choice(pid, name)
            if workers is not None:
                return workers
            return AttachChoice(pid, [], pid, f"pid {pid} ({name}): the Python process named")
        me = rank_process(pid)
        if me is not None:
            why = f"pid {pid} is rank {me.rank}; its job's local ranks: {_rank_words(ranks)}"
            return AttachChoice(pid, ranks, pid, why)
        primary = min(ranks, key=lambda r: r.rank)
        why = f"pid {pid} ({name}) launched ranks {_rank_words(ranks)}"
        return AttachChoice(primary.pid, ranks, pid, why)
    refused = not_a_launcher(pid)
    ranks = [] if refused else own_ranks(find_ranks(pid), uid)
    if not ranks:
        because = f" and is not taken as a launcher: {refused}" if refused else ""
        raise UsageError(
            f"cannot attach: pid {pid} ({name}) is not a Python process{because}; "
            "name the training process or the launcher you started"
        )
    primary = min(ranks, key=lambda r: r.rank)
    why = f"pid {pid} ({name}) is a launcher with ranks of its own: {_rank_words(ranks)}"
    return AttachChoice(primary.pid, ranks, pid, why)


def triton_choice(pid: int) -> AttachChoice:
    """A Triton server named: the busiest Python process that runs its models (a Python
    backend's stub, or PyTriton's process that started the server), the server's own
    counters read beside it; UsageError when its models are not Python."""
    try:
        proc = psutil.Process(pid)
        near = proc.children(recursive=True) + ([proc.parent()] if proc.parent() else [])
    except psutil.Error:
        near = []
    runs = [p for p in near if p is not None and (_is_python(p.pid) or _name(p.pid) == STUB_NAME)]
    if not runs:
        raise UsageError(
            f"cannot attach: pid {pid} ({SERVER_NAME}) runs no Python model (no Python backend "
            "stub, no PyTriton process): gpudiag reads Triton's counters beside a Python process"
        )
    busy = max(runs, key=_cpu_s)
    why = (
        f"pid {pid} ({SERVER_NAME}) runs its Python models in pid {busy.pid} "
        f"({_name(busy.pid)}), the busiest: pid {busy.pid} profiled, with the server's counters"
    )
    return AttachChoice(busy.pid, [], pid, why)


def supervised_server(pid: int) -> tuple[int, str] | None:
    """(its busiest Python child, the supervisor's frame) when `pid`'s main thread sits in a
    supervisor's frames (Werkzeug's reloader, uvicorn's --reload/--workers, gunicorn's
    arbiter) and it has a Python child: the server is the child; None otherwise."""
    try:
        kids = [k for k in psutil.Process(pid).children(recursive=True) if _is_python(k.pid)]
    except psutil.Error:
        return None
    if not kids or _busy(pid):
        return None  # a supervisor waits: a busy process (a training loop) is not one
    frames, problem = dump_main_stack(pid, timeout_s=10.0)  # innermost first
    server = [
        f
        for f in frames
        if SERVER_FILE_RE.search(_file_of(f)) or SUPERVISOR_FILE_RE.search(_file_of(f))
    ]
    if problem is not None or not server or not SUPERVISOR_FILE_RE.search(_file_of(server[0])):
        return None  # its innermost server frame is not a supervisor's: it serves itself
    where = server[0]
    busy = {k.pid: _cpu_s(k) for k in kids}
    return max(busy, key=lambda k: busy[k]), where


# frames of a loop that runs in the process itself (a DataLoader's, a model's): a job that
# waits there is the loop, whatever its children do
OWN_LOOP_RE = re.compile(r"/torch/(utils/data|nn/modules|optim|autograd)/")


def worker_choice(pid: int, name: str) -> AttachChoice | None:
    """A server whose model runs in worker processes (`workers.server_processes`), named by
    its front end that only waits: its busiest model worker profiled (its stacks are the
    loop's), the front end's other processes loaded with the hooks beside it (they take the
    requests); None when `pid` is not such a front end."""
    procs = server_processes(pid)
    if procs is None or _busy(pid):
        return None  # a busy process does its own work: it is the job
    frames, problem = dump_main_stack(pid, timeout_s=10.0)
    if problem is None and any(OWN_LOOP_RE.search(_file_of(f)) for f in frames):
        return None  # its main thread waits in its own loop (a starved DataLoader)
    worker = procs.model[0]
    why = (
        f"pid {pid} ({name}) is a server's front end whose model runs in worker processes: "
        f"{procs.words()}; pid {worker} profiled as the loop"
    )
    # the hooks go where requests are answered: the processes sharing its listening socket,
    # else the front end itself (it serves, its engine in a worker: vLLM's API server)
    serving = (*(procs.http or (pid,)), *procs.model[1:])
    serving = tuple(p for p in dict.fromkeys(serving) if p != worker)  # a worker that serves
    return AttachChoice(worker, [], pid, why, procs.roles, serving)


def _busy(pid: int, over_s: float = 0.2) -> bool:
    """Whether `pid` used more than a fifth of a core over `over_s` seconds."""
    try:
        return psutil.Process(pid).cpu_percent(interval=over_s) > 20.0
    except psutil.Error:
        return True


def _file_of(frame: str) -> str:
    """The file of a dumped frame, "function (file:line)"."""
    return frame.rsplit(" (", 1)[-1].rsplit(":", 1)[0]


def _cpu_s(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return -1.0
    return t.user + t.system
