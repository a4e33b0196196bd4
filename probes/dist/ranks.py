"""Rank discovery: the processes of a distributed job on this host, told by their environment.

A launcher (torchrun, `python -m torch.distributed.run`, accelerate, Lightning, Slurm's
`srun`, DeepSpeed) starts one Python process per local rank and hands each its identity in
the environment: RANK / LOCAL_RANK / WORLD_SIZE (torchrun, accelerate, DeepSpeed, Lightning
with `strategy="ddp"` once it spawns), SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS (srun).
The ranks of one job share the launcher's run id (TORCHELASTIC_RUN_ID), the rendezvous
(MASTER_ADDR:MASTER_PORT) or the Slurm job and step.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psutil

from gpudiag.probes.files import MAX_ENVIRON_BYTES, read_head

# (rank, local rank, world size) variables, first found wins
_RANK = ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
_LOCAL = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_WORLD = ("WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


@dataclass(frozen=True)
class RankInfo:
    """One rank of a job: its identity, process and device."""

    rank: int
    local_rank: int | None
    world_size: int | None
    pid: int
    host: str
    gpu: str | None  # the device it sees: CUDA_VISIBLE_DEVICES entry or its local rank
    job: str | None  # what ties it to the job's other ranks (run id, rendezvous, Slurm step)

    def to_dict(self) -> dict:
        """The JSON form used in reports."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "pid": self.pid,
            "host": self.host,
            "gpu": self.gpu,
        }


def read_environ(pid: int) -> dict[str, str] | None:
    """A process's environment at its start; None when it cannot be read."""
    try:
        raw = read_head(f"/proc/{pid}/environ", MAX_ENVIRON_BYTES)
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _int(env: dict[str, str], names: tuple[str, ...]) -> int | None:
    for n in names:
        v = env.get(n, "").strip()
        if v.isdigit():
            return int(v)
    return None


def job_key(env: dict[str, str]) -> str | None:
    """What the ranks of one job share: launcher run id, Slurm step or rendezvous."""
    if env.get("TORCHELASTIC_RUN_ID"):
        return "run:" + env["TORCHELASTIC_RUN_ID"]
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    if env.get("MASTER_ADDR") or env.get("MASTER_PORT"):
        return f"rdzv:{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    return None


def rank_of_env(env: dict[str, str], pid: int, host: str | None = None) -> RankInfo | None:
    """The rank a process's environment names, or None when it names none."""
    rank = _int(env, _RANK)
    if rank is None:
        return None
    local = _int(env, _LOCAL)
    gpu = None
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(visible) == 1:
        gpu = visible[0]
    elif local is not None:
        gpu = visible[local] if local < len(visible) else str(local)
    return RankInfo(
        rank=rank,
        local_rank=local,
        world_size=_int(env, _WORLD),
        pid=pid,
        host=host or socket.gethostname(),
        gpu=gpu,
        job=job_key(env),
    )


def _is_python(proc: psutil.Process) -> bool:
    try:
        return os.path.basename(proc.exe()).startswith("python")
    except (psutil.Error, OSError):
        return False


def rank_process(pid: int) -> RankInfo | None:
    """The rank of a Python process, None when it is not one (or cannot be read)."""
    env = read_environ(pid)
    if env is None:
        return None
    try:
        if not _is_python(psutil.Process(pid)):
            return None
    except psutil.Error:
        return None
    return rank_of_env(env, pid)


def _keep_outermost(found: list[RankInfo]) -> list[RankInfo]:
    """One process per rank: a rank's own children (DataLoader workers inherit RANK) are
    not ranks; keep the process whose parent does not carry the same rank."""
    by_pid = {r.pid: r for r in found}
    out: list[RankInfo] = []
    for r in found:
        try:
            parent = psutil.Process(r.pid).ppid()
        except psutil.Error:
            continue
        p = by_pid.get(parent)
        if p is not None and p.rank == r.rank:
            continue
        out.append(r)
    seen: dict[int, RankInfo] = {}
    for r in sorted(out, key=lambda r: r.pid):
        seen.setdefault(r.rank, r)
    return sorted(seen.values(), key=lambda r: r.rank)


def find_ranks(root_pid: int) -> list[RankInfo]:
    """The ranks started below (or being) `root_pid`, one per rank, by rank."""
    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return []
    found = [r for p in procs if (r := rank_process(p.pid)) is not None]
    return _keep_outermost(found)


def sibling_ranks(pid: int) -> list[RankInfo]:
    """For `attach PID`: the job's local ranks. PID may be the launcher (its descendants are
    the ranks) or one rank (the other ranks share its job key, or its parent)."""
    below = find_ranks(pid)
    me = rank_process(pid)
    if me is None:
        return below
    env = read_environ(pid) or {}
    key = job_key(env)
    try:
        parent = psutil.Process(pid).ppid()
    except psutil.Error:
        parent = None
    found = [me]
    for proc in psutil.process_iter(["pid", "ppid"]):
        other = proc.info["pid"]
        if other == pid:
            continue
        same_parent = parent not in (None, 0, 1) and proc.info["ppid"] == parent
        if not same_parent and key is None:
            continue
        r = rank_process(other)
        if r is None:
            continue
        if same_parent or (key is not None and r.job == key):
            found.append(r)
    return _keep_outermost(found)
