"""Launching the job to profile (`run`, `gate`): the in-process hooks injected into its
environment, its Python process found below launchers, a session set up on it."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, replace
from typing import Any

from gpudiag.agent.base.config import Settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
from gpudiag.probes.base import ProbeStatus, Target
from gpudiag.probes.inprocess.channel import HookProbe, injection_env
from gpudiag.probes.spawn import start_process


@dataclass
class Job:
    """A launched job and the hooks probe its environment points at (None: not injected)."""

    command: list[str]
    popen: subprocess.Popen
    hooks: HookProbe | None

    def find_target(self) -> tuple[int, tuple[list, int] | None]:
        """The job's Python process to follow (the primary rank of a launcher's ranks, else
        the Python process started), and the ranks with the root pid when it has ranks."""
        from gpudiag.agent.session.ranks.launch import is_launcher, primary_of, wait_for_ranks
        from gpudiag.probes.dist.ranks import rank_process

        ranks = []
        if is_launcher(self.command):
            alive = lambda: self.popen.poll() is None  # noqa: E731
            ranks = wait_for_ranks(self.popen.pid, alive)
        target = primary_of(ranks).pid if ranks else find_python_process(self.popen)
        if not ranks:  # one rank of a job started per rank (srun, a per-host script)
            me = rank_process(target)
            ranks = [me] if me is not None else []
        return target, ((ranks, self.popen.pid) if ranks else None)

    def session(
        self,
        settings: Settings,
        opts: SessionOptions,
        found: tuple[int, tuple[list, int] | None] | None = None,
        parts: SessionParts | None = None,
    ) -> Session:
        """A session on the job's Python process with the hooks and, for a multi-rank job,
        every rank (`found`: what find_target() said, else it is asked); `parts` gives the
        rest (sink, log, stop_signals...)."""
        target, ranks = found or self.find_target()
        opened = {}
        if self.hooks is not None:  # not available: its socket could not be made (why)
            opened[self.hooks.name] = self.hooks.refused or ProbeStatus(self.hooks.name, True)
        mine = replace(
            parts or SessionParts(), popen=self.popen, hooks=self.hooks, ranks=ranks, opened=opened
        )
        return Session(Target(target), settings, opts, mine)


def launch(
    command: list[str],
    inject: bool = True,
    stdout: Any = None,
    stderr: Any = None,
    extra_env: dict[str, str] | None = None,
) -> Job:
    """Start `command`; with `inject`, the in-process hooks (exact step timing) are added to
    its environment when their socket can be made (else the job runs without them and the
    hooks' status says why). UsageError when it cannot start."""
    hooks = HookProbe() if inject else None
    env = None
    if hooks is not None and hooks.open(Target(0)).available:
        env = injection_env(dict(os.environ), hooks.path or "")
        env.update(extra_env or {})
    from gpudiag.agent.session.ranks.launch import flight_recorder_env, is_launcher

    if is_launcher(command):  # NCCL's flight recorder: collective sequence numbers per rank
        env = flight_recorder_env(env if env is not None else dict(os.environ))
    try:
        popen = start_process(command, env=env, stdout=stdout, stderr=stderr)
    except OSError as exc:
        if hooks is not None:
            hooks.close()
        why = {FileNotFoundError: "command not found", PermissionError: "permission denied"}
        raise UsageError(
            f"cannot start {command[0]!r}: {why.get(type(exc), exc.strerror or exc)}"
        ) from None
    return Job(command, popen, hooks)


def _is_python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def find_python_process(popen: subprocess.Popen, wait_s: float = 10.0) -> int:
    """The launched job's Python process: itself, or (for `bash train.sh`-style launchers)
    the first Python process started below it within `wait_s` seconds."""
    import psutil

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and popen.poll() is None:
        if _is_python(popen.pid):
            return popen.pid
        try:
            kids = psutil.Process(popen.pid).children(recursive=True)
        except psutil.Error:
            break
        for kid in sorted(kids, key=lambda k: k.pid):
            if _is_python(kid.pid):
                return kid.pid
        time.sleep(0.1)
    return popen.pid
