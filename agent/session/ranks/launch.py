"""A job's ranks from outside: whether a command is a multi-rank launcher, its ranks once
they started, the primary one, and the NCCL flight recorder switched on in its environment."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from gpudiag.probes.dist.ranks import RankInfo, find_ranks, read_environ

LAUNCHER_RE = re.compile(
    r"(^|/)(torchrun|accelerate|deepspeed|srun|mpirun|lightning)$|"
    r"^torch\.distributed\.(run|launch)$"
)


FR_SIZE_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # new name, old name
FR_NEW_NAME_FROM = (2, 8)  # torch releases that read TORCH_FR_BUFFER_SIZE (and warn on the old)


def _torch_version() -> tuple[int, int] | None:
    """The installed torch's (major, minor), from its metadata (torch is not imported)."""
    try:
        from importlib.metadata import version

        major, minor = version("torch").split(".")[:2]
        return int(major), int(minor)
    except Exception:
        return None


def flight_recorder_env(env: dict[str, str]) -> dict[str, str]:
    """The job's environment with PyTorch's NCCL flight recorder on (each rank keeps its last
    2000 collectives with sequence numbers and states; dumped on a watchdog timeout), unless
    the user set it; NCCL-less jobs ignore it. The buffer variable's name follows the
    installed torch: newer releases warn at every rank's start on the old one."""
    out = dict(env)
    if any(k in out for k in FR_SIZE_NAMES):
        return out
    ver = _torch_version()
    out[FR_SIZE_NAMES[0] if ver is None or ver >= FR_NEW_NAME_FROM else FR_SIZE_NAMES[1]] = "2000"
    out.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    return out


def flight_recorder_note(pid: int) -> str:
    """Whether a rank runs with the NCCL flight recorder, in words for the report."""
    env = read_environ(pid) or {}
    for name in FR_SIZE_NAMES:
        size = env.get(name, "")
        if size.isdigit() and int(size) > 0:
            return f"NCCL flight recorder on ({name}={size}) for NCCL jobs"
    return (
        "NCCL flight recorder off (TORCH_FR_BUFFER_SIZE unset or 0): for NCCL jobs "
        "the collectives' sequence numbers come only from gpudiag's hooks; start the job "
        "with `gpudiag run` or set TORCH_FR_BUFFER_SIZE=2000 (TORCH_NCCL_TRACE_BUFFER_SIZE "
        "before torch 2.8)"
    )


def is_launcher(command: list[str]) -> bool:
    """Whether a command starts a multi-rank launcher (torchrun, accelerate, srun...)."""
    return any(LAUNCHER_RE.search(a) for a in command[:4])


def wait_for_ranks(
    root_pid: int, alive: Callable[[], bool], timeout_s: float = 30.0, plain_s: float = 5.0
) -> list:
    """The ranks below a launcher, once some have started and their count held for 1 s; []
    when the launcher ran a plain (rank-less) Python child for `plain_s` (one process)."""
    import psutil

    start = time.monotonic()
    deadline = start + timeout_s
    found: list[RankInfo] = []
    stable_since = time.monotonic()
    while time.monotonic() < deadline and alive():
        now = find_ranks(root_pid)
        if not now and time.monotonic() - start >= plain_s:
            try:
                kids = [k.name() for k in psutil.Process(root_pid).children(recursive=True)]
            except psutil.Error:
                kids = []
            if any(name.startswith("python") for name in kids):
                return []
        if [r.pid for r in now] != [r.pid for r in found]:
            found, stable_since = now, time.monotonic()
        want = found[0].world_size if found else None
        if found and (len(found) == want or time.monotonic() - stable_since >= 1.0):
            return found
        time.sleep(0.1)
    return found


def primary_of(ranks: list[RankInfo]) -> RankInfo:
    """The rank the main timeline follows: the lowest."""
    return min(ranks, key=lambda r: r.rank)
