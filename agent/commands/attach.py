"""`gpudiag attach PID`: profile a running job (or a launcher's ranks) without restarting
it; one clear line when its stacks cannot be read."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

from gpudiag.agent.base.config import Settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.options import ProfilingOptions, profiling_options
from gpudiag.agent.fleet.identity import other_user
from gpudiag.agent.fleet.server import MetricsServer
from gpudiag.agent.output.report import default_report_name
from gpudiag.agent.session.hookload import load_hooks
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts, Subject
from gpudiag.agent.session.setup import make_probes, open_probe
from gpudiag.agent.session.signals import StopSignals
from gpudiag.agent.session.targets import choose_target
from gpudiag.agent.session.targetwatch import running
from gpudiag.agent.session.wiring import Outputs, Wiring
from gpudiag.probes.base import Probe, ProbeStatus, Target
from gpudiag.probes.files import MAX_CMDLINE_BYTES, read_head
from gpudiag.probes.inject.gpudiag_hooks import attach_path
from gpudiag.probes.inprocess.channel import HookProbe
from gpudiag.probes.stacks.probe import StackProbe
from gpudiag.text.redact import redact_argv
from gpudiag.text.sink import say

EXIT_OK = 0


@dataclass(frozen=True, kw_only=True)
class AttachOptions(ProfilingOptions):
    """`gpudiag attach`'s options: the profiling ones, the job's PID and --hooks."""

    pid: str  # as given: parse_pid() checks it names a running process
    hooks: bool = False

    def sampling(self) -> SessionOptions:
        """The session's options: the job runs already; --hooks loads the hooks into it."""
        return self.session(attached=True, load_hooks=self.hooks)


def attach_job(opts: AttachOptions, pid: int, settings: Settings) -> int:
    """`gpudiag attach`: the session's options from the command's, then attach()."""
    server = opts.open_metrics(settings)
    try:
        return attach(pid, settings, opts.sampling(), opts.outputs(), opts.out, server)
    finally:
        if server is not None:
            server.close()


@dataclass
class _Attached:
    """A running job gpudiag could attach to: its stack probe opened, the rest not yet."""

    pid: int
    cmdline: list[str]
    out: str
    probes: list[Probe]
    stacks: ProbeStatus  # the stack probe's status (open)
    ranks: tuple[list, int] | None  # a multi-rank job's ranks and root pid
    hooks: ProbeStatus | None = None  # --hooks: the hooks probe, opened and loaded
    processes: list[dict] | None = None  # a server's processes and their roles
    server: int | None = None  # their front end (the job's root), when pid is its worker

    def opened(self) -> dict[str, ProbeStatus]:
        """The probes opened before the session starts, with their status."""
        return {"stacks": self.stacks} | ({"hooks": self.hooks} if self.hooks else {})


def attach(
    pid: int,
    settings: Settings,
    opts: SessionOptions,
    outs: Outputs,
    out: str | None = None,
    server: MetricsServer | None = None,
) -> int:
    """Profile the running job `pid` (or a launcher's ranks) and write the report to `out`
    (else a default name); UsageError when its stacks cannot be read at all."""
    choice = choose_target(pid)
    ranks, root, pid = choice.ranks, choice.root, choice.pid
    # a server under its supervisor: its workers' instrument()-ed hooks send to their own
    # pid's socket, else their parent's: the supervisor's catches every worker's requests
    hooks = HookProbe(attach_path(root if not ranks else pid), optional=True)
    probes = make_probes(opts, hooks, max(1, len(ranks or ())))
    stacks = next(p for p in probes if isinstance(p, StackProbe))
    status = open_probe(stacks, Target(pid))
    if not status.available:
        for p in probes:
            if p is not stacks:
                p.close()
        hint = f" ({status.hint})" if status.hint else ""
        raise UsageError(f"cannot attach: {other_user(pid) or status.reason}{hint}")
    try:
        command = read_head(f"/proc/{pid}/cmdline", MAX_CMDLINE_BYTES).split(b"\0")
        cmdline = [c.decode(errors="replace") for c in command if c]
    except OSError:
        cmdline = []
    out = out or default_report_name(pid, time.time())
    if not outs.quiet:
        say(f"profiling {choice.why}")
    att = _Attached(pid, cmdline, out, probes, status, (ranks, root) if ranks else None)
    att.processes = [r.to_dict() for r in choice.roles]
    att.server = choice.root if choice.roles else None
    if opts.load_hooks:  # a server's model worker, and the processes that take its requests
        pids = [r.pid for r in ranks] if ranks else [pid, *choice.serving]
        att.hooks = _load(hooks, pids, outs.quiet, ranks=bool(ranks))
    if outs.tui:
        return _attach_profile(outs, att, opts, settings, server)
    with StopSignals() as stops:
        return _attach_profile(outs, att, opts, settings, server, stops)


def _attach_profile(
    outs: Outputs,
    att: _Attached,
    opts: SessionOptions,
    settings: Settings,
    server: MetricsServer | None,
    stops: StopSignals | None = None,
) -> int:
    pid, cmdline, out = att.pid, att.cmdline, att.out
    if not outs.quiet:
        say(
            f"attached to pid {pid} ({' '.join(redact_argv(cmdline) or [])})"
            + (
                f" for {opts.duration_s:.0f} s"
                if opts.duration_s
                else "; Ctrl-C stops and writes the report"
            )
        )
    subject = Subject("attach", cmdline, pid, out)
    wiring = Wiring(outs, server, subject, settings, opts)
    wiring.processes = att.processes or None
    session = wiring.built(
        Session(
            Target(pid, att.server),
            settings,
            opts,
            wiring.parts(
                SessionParts(
                    probes=att.probes, ranks=att.ranks, opened=att.opened(), stop_signals=stops
                )
            ),
        )
    )
    wiring.announce()
    try:
        if outs.tui:
            from gpudiag.agent.session.live import run_with_tui

            result = run_with_tui(session, subject, att.opened())
        else:
            result = session.run()
    except BaseException:
        if server is not None:  # no report to settle the job with: its series end here
            server.collector.jobs = lambda: []
        raise
    wiring.finish(result)  # settles the job: the last export carries the report's numbers
    return EXIT_OK


def _load(hooks: HookProbe, pids: list[int], quiet: bool, ranks: bool) -> ProbeStatus:
    """--hooks: the hooks probe opened and the hooks loaded into `pids` (or why not)."""
    status = open_probe(hooks, Target(pids[0]))
    if status.available:
        if not quiet:
            say(f"loading the hooks into pid {', '.join(map(str, pids))} (--hooks)")
        status = load_hooks(hooks, pids, ranks=ranks)
    if not quiet:
        say(f"hooks: {status.reason or 'loaded'}")
    return status


def parse_pid(text: str) -> int:
    """A pid from the command line, or UsageError."""
    try:
        pid = int(text)
    except ValueError:
        raise UsageError(f"PID must be a number, got {text!r}") from None
    if pid <= 0:
        raise UsageError(f"PID must be positive, got {pid}")
    if not os.path.exists(f"/proc/{pid}"):
        raise UsageError(f"no process with pid {pid}")
    if pid == os.getpid():
        raise UsageError("cannot attach to gpudiag itself")
    if not running(pid):
        raise UsageError(f"pid {pid} has already exited (a zombie its parent has not reaped)")
    return pid


def main(opts: AttachOptions) -> int:
    """`gpudiag attach PID`: profile a running job; exit 2 when it cannot be read at all."""
    pid = parse_pid(opts.pid)
    settings = opts.settings()
    opts.check_outputs()
    return attach_job(opts, pid, settings)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `attach` subcommand and its options."""
    p = sub.add_parser(
        "attach",
        help="profile a running job by PID",
        description="Profile a running Python job without restarting it, "
        "until Ctrl-C, the job's exit, or --duration.",
    )
    p.add_argument("pid", help="process id of the job's Python process")
    groups = profiling_options(p, "attach")
    groups["sampling"].add_argument(
        "--hooks",
        action="store_true",
        help="load run's in-process hooks into the running job (exact steps/s, data wait, "
        "batch sizes; on Python 3.10-3.13 by pyinjector where it is installed, else gdb; "
        "sys.remote_exec on 3.14+; needs ptrace permission). Without it attach only reads "
        "the job",
    )
