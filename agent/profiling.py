"""Profiling a job for `run` and `attach`: the session set up from the command line's
options, a recording beside it, and the report written and summarised at the end."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudiag.agent.config import Settings
from gpudiag.agent.environment import describe_environment
from gpudiag.agent.errors import UsageError
from gpudiag.agent.identity import other_user
from gpudiag.agent.joboutput import StderrTee, job_log_path
from gpudiag.agent.launch import Job, launch
from gpudiag.agent.metrics import chain_sinks
from gpudiag.agent.metrics_server import MetricsServer, open_metrics, serve_job
from gpudiag.agent.recording import Recorder
from gpudiag.agent.render import render_markdown, render_text
from gpudiag.agent.report import check_writable, default_report_name, report_of, write_report
from gpudiag.agent.safeio import dumps_json
from gpudiag.agent.session import Session, SessionOptions, SessionResult
from gpudiag.agent.session_setup import make_probes, open_probe
from gpudiag.agent.signals import StopSignals
from gpudiag.agent.targets import choose_target
from gpudiag.analyzers.timeline import Timeline
from gpudiag.probes.base import Probe, ProbeStatus, Target
from gpudiag.probes.gpu import hardware_summary
from gpudiag.probes.inject.gpudiag_hooks import attach_path
from gpudiag.probes.inprocess import HookProbe
from gpudiag.probes.stacks import StackProbe
from gpudiag.text.redact import redact_argv, redact_lines

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130


def say(msg: str) -> None:
    """A status line on stderr, as a session logs it."""
    print(f"gpudiag: {msg}", file=sys.stderr, flush=True)


def session_options(args: argparse.Namespace, attached: bool = False) -> SessionOptions:
    """The sampling options `run` and `attach` take (`attached`: the job runs already, and
    a --capture-steps is asked of its hooks once they connect)."""
    budget = getattr(args, "cpu_budget", 3.0)
    return SessionOptions(
        attached=attached,
        capture_steps=getattr(args, "capture_steps", None) if attached else None,
        duration_s=args.duration,
        rate_hz=args.rate,
        window_s=args.window,
        nonblocking=not args.blocking,
        progress=not args.quiet,
        cpu_budget=budget / 100.0 if budget else None,
        until_sure=bool(getattr(args, "until_sure", False)),
    )


def _recorder(
    args: argparse.Namespace, mode: str, command: list[str], pid: int, timeline: Timeline
) -> Recorder | None:
    """--record: the recorder of the session that fills `timeline`."""
    if not getattr(args, "record", None):
        return None
    return Recorder(
        args.record,
        {
            "environment": describe_environment(pid, hardware_summary()),
            "run": {"mode": mode, "command": command, "pid": pid},
        },
        max_bytes=int(args.record_max_mb * 1024 * 1024),
        layout=args.record_layout,
        width_ns=lambda: timeline.segment_ns,  # called under the session's ingest lock
    )


class Wiring:
    """Where a session's samples and events go, made before the session itself (a recorder,
    the metrics endpoint, the report written when a multi-rank job hangs)."""

    def __init__(
        self,
        args: argparse.Namespace,
        server: MetricsServer | None,
        mode: str,
        command: list[str],
        pid: int,
        out: str,
        settings: Settings,
        opts: SessionOptions,
    ) -> None:
        self.args, self.server, self.mode = args, server, mode
        self.command, self.pid, self.out, self.settings = command, pid, out, settings
        self.timeline = Timeline(skip_steps=opts.skip_steps)
        self.recorder = _recorder(args, mode, command, pid, self.timeline)
        self.session: Session | None = None  # the session built from this wiring
        self.live = None
        if server is not None:
            from gpudiag.agent.live import live_doc

            self.live = serve_job(
                server, lambda: live_doc(self.session, mode, command, pid), pid, command
            )

    def kwargs(self, tui: bool) -> dict:
        """The Session arguments: its timeline, sink, log and hang report."""
        sinks = (self.recorder.write if self.recorder else None, self.live and self.live.tap)
        more: dict = {
            "timeline": self.timeline,
            "sink": chain_sinks(*sinks) if any(sinks) else None,
            "on_hang": self.hang_report,
        }
        if tui:
            more["log"] = lambda msg: None  # the UI shows the status
        return more

    def built(self, session: Session) -> Session:
        """The session made from kwargs() (the metrics endpoint reports it)."""
        self.session = session
        return session

    def announce(self) -> None:
        """Say where the metrics are served, when they are."""
        if self.server is not None and self.session and not getattr(self.args, "quiet", False):
            self.session.log(f"metrics on {self.server.url}")

    def hang_report(self, session: Session) -> None:
        """A multi-rank job hangs: the report (DIST002, every rank's stack) is written to
        `out` at once, while the job is still hung; the final report replaces it."""
        doc = report_of(
            session.result_so_far(),
            mode=self.mode,
            command=self.command,
            pid=self.pid,
            settings=self.settings,
        )
        path = write_report(doc, self.out)
        session.log(f"the job hangs (DIST002): report written to {path} while it is hung")


def print_summary(doc: dict, fmt: str) -> None:
    """The summary on stdout: json (the whole report), markdown or text."""
    if fmt == "html":
        from gpudiag.agent.html_report import render_html

        print(render_html(doc), end="")
    elif fmt == "json":
        print(dumps_json(doc, indent=2))  # strict JSON: never a NaN token
    elif fmt == "markdown":
        print(render_markdown(doc))
    else:
        print(render_text(doc, verbose=False))


def finish(
    result: SessionResult,
    args: argparse.Namespace,
    mode: str,
    command: list[str],
    pid: int,
    out: str,
    settings: Settings,
    recorder: Recorder | None = None,
    stderr_tail: list[str] | None = None,
) -> dict:
    """Close the recording, write the report, print the summary and where the files are."""
    env = describe_environment(pid, result.hardware)
    if recorder is not None:
        recorder.close(
            {
                "probes": [p.to_dict() for p in result.probes],
                "errors": result.errors,
                "end_reason": result.end_reason,
                "exit_code": result.exit_code,
                "start": result.start,
                "end": result.end,
                "environment": env,
                "agent": result.agent,
            }
        )
    doc = report_of(result, mode=mode, command=command, pid=pid, settings=settings, environment=env)
    if stderr_tail:
        doc["run"]["stderr_tail"] = redact_lines(stderr_tail)
    if recorder is not None and recorder.failed:
        doc["errors"].append(
            {"source": "recording", "message": f"recording stopped: {recorder.failed}", "t": None}
        )
    try:
        path, failed = write_report(doc, out), None
    except UsageError as exc:  # disk full, folder gone: nothing half-written is left behind
        path, failed = None, str(exc)
    fmt = getattr(args, "format", "text")
    print_summary(doc, fmt)  # the summary still shows what was found
    note = sys.stdout if fmt == "text" else sys.stderr  # keep a json/markdown stdout clean
    if path is not None:
        print(
            f"Report written to {path}  (details: gpudiag report {shlex.quote(str(path))})",
            file=note,
        )
    if getattr(args, "speedscope", None) or getattr(args, "trace", None):
        from gpudiag.agent.exports import write_exports

        for line in write_exports(doc, args.speedscope, args.trace):
            print(line, file=note)
    if recorder is not None and not recorder.failed:
        print(
            f"Recording written to {recorder.path}  (gpudiag replay {shlex.quote(recorder.path)})",
            file=note,
        )
    elif recorder is not None:
        print(f"gpudiag: recording {recorder.path} stopped: {recorder.failed}", file=sys.stderr)
    if failed:
        raise UsageError(failed)
    return doc


def capture_env(args: argparse.Namespace) -> dict[str, str]:
    """The job's environment for `--capture-steps N` (empty without it)."""
    n = getattr(args, "capture_steps", None)
    if not n:
        return {}
    if args.no_inject:
        raise UsageError("--capture-steps needs the in-process hooks: drop --no-inject")
    return {"GPUDIAG_CAPTURE_STEPS": str(n)}


def run_job(args: argparse.Namespace, command: list[str], settings: Settings) -> int:
    """Launch the job, profile it, write the report; the job's exit code (or ours)."""
    # a machine-readable summary is all that goes to stdout: the job's stdout goes to stderr;
    # under the terminal UI both go to its log panel and a file, never over the UI
    job_stdout = None if args.format == "text" else sys.stderr.fileno()
    log_path = job_log_path(args.out) if args.tui else None
    if log_path:
        check_writable(log_path)
    server = open_metrics(args)
    err_r, err_w = os.pipe()
    try:
        job = launch(
            command,
            inject=not args.no_inject,
            stdout=err_w if log_path else job_stdout,
            stderr=err_w,
            extra_env=capture_env(args),
        )
    except UsageError:
        os.close(err_r)
        if server is not None:
            server.close()
        raise
    finally:
        os.close(err_w)
    tee = StderrTee(err_r, log_path)

    def pass_on(signum: int, count: int) -> None:
        # SIGTERM and SIGHUP stop the run: the job gets them too, as it would without
        # gpudiag (a terminal's Ctrl-C already reaches the whole foreground group)
        if signum != signal.SIGINT and job.popen.returncode is None:
            os.kill(job.popen.pid, signum)

    try:
        if args.tui:  # the UI handles SIGTERM/SIGHUP itself, and passes them on too
            return _profile_launched(args, job, settings, tee, server, pass_on=pass_on)
        with StopSignals(pass_on) as stops:
            return _profile_launched(args, job, settings, tee, server, stops)
    finally:
        tee.close()


def _profile_launched(
    args: argparse.Namespace,
    job: Job,
    settings: Settings,
    tee: StderrTee,
    server: MetricsServer | None = None,
    stops: StopSignals | None = None,
    pass_on: Callable[[int, int], None] | None = None,
) -> int:
    popen, command = job.popen, job.command
    out = args.out or default_report_name(popen.pid, time.time())
    opts = session_options(args)
    found = job.find_target()
    target = found[0]
    wiring = Wiring(args, server, "run", command, target, out, settings, opts)
    session = wiring.built(
        job.session(settings, opts, found, stop_signals=stops, **wiring.kwargs(args.tui))
    )
    recorder = wiring.recorder
    if not args.quiet:
        session.log(
            f"profiling pid {popen.pid} ({' '.join(redact_argv(command) or [])})"
            + (f" for {args.duration:.0f} s" if args.duration else " until it exits")
        )
    wiring.announce()
    passed: list[int] = []  # signals the UI passed on to the job
    try:
        if args.tui:
            from gpudiag.agent.live import JobView, run_with_tui

            relay = None
            if pass_on is not None:

                def relay(signum: int, count: int) -> None:
                    passed.append(signum)
                    pass_on(signum, count)

            view = JobView(popen, tee.take_lines, tee.log_path)
            result = run_with_tui(session, "run", command, target, out, pass_on=relay, job=view)
        else:
            result = session.run()
    finally:
        if server is not None:
            server.close()
    failed = result.exit_code not in (None, 0)
    finish(
        result,
        args,
        "run",
        command,
        target,
        out,
        settings,
        recorder,
        stderr_tail=tee.lines() if failed else None,
    )
    if result.end_reason in ("duration_reached", "verdict_sure"):
        print(f"gpudiag: profiling done; the job (pid {popen.pid}) keeps running", file=sys.stderr)
        return EXIT_OK
    code = result.exit_code
    if tee.log_path:
        print(f"gpudiag: the job's output is in {tee.log_path}", file=sys.stderr)
    if code is None and (passed or args.tui) and popen.poll() is not None:
        code = popen.returncode  # it ended on the signal the UI passed on, or on q
    if code is None and popen.poll() is None and (stops is not None or passed or args.tui):
        # never leave the job orphaned: wait for it, unless the user interrupts again
        print(
            f"gpudiag: waiting for the job (pid {popen.pid}) to exit "
            "(interrupt again to leave it running)",
            file=sys.stderr,
            flush=True,
        )
        if stops is not None:
            code = popen.wait()
        else:  # after the UI: its handlers are gone; a new one passes on, a second exits
            with StopSignals(pass_on) as again:
                again.count = 1 if passed else 0  # after q: one more interrupt is the first
                code = popen.wait()
    if code is not None:
        return code if code >= 0 else 128 - code
    return EXIT_INTERRUPTED if result.end_reason == "interrupted" else EXIT_OK


def attach_job(args: argparse.Namespace, pid: int, settings: Settings) -> int:
    """Profile a running job; UsageError when its stacks cannot be read at all."""
    server = open_metrics(args)
    try:
        return _attach(args, pid, settings, server)
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


def _attach(
    args: argparse.Namespace, pid: int, settings: Settings, server: MetricsServer | None
) -> int:
    opts = session_options(args, attached=True)
    choice = choose_target(pid)
    ranks, root, pid = choice.ranks, choice.root, choice.pid
    hooks = HookProbe(attach_path(pid), optional=True)
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
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        cmdline = [c.decode(errors="replace") for c in command if c]
    except OSError:
        cmdline = []
    out = args.out or default_report_name(pid, time.time())
    if not args.quiet:
        say(f"profiling {choice.why}")
    att = _Attached(pid, cmdline, out, probes, status, (ranks, root) if ranks else None)
    if args.tui:
        return _attach_profile(args, att, opts, settings, server)
    with StopSignals() as stops:
        return _attach_profile(args, att, opts, settings, server, stops)


def _attach_profile(
    args: argparse.Namespace,
    att: _Attached,
    opts: SessionOptions,
    settings: Settings,
    server: MetricsServer | None,
    stops: StopSignals | None = None,
) -> int:
    pid, cmdline, out = att.pid, att.cmdline, att.out
    if not args.quiet:
        say(
            f"attached to pid {pid} ({' '.join(redact_argv(cmdline) or [])})"
            + (
                f" for {args.duration:.0f} s"
                if args.duration
                else "; Ctrl-C stops and writes the report"
            )
        )
    wiring = Wiring(args, server, "attach", cmdline, pid, out, settings, opts)
    session = wiring.built(
        Session(
            Target(pid),
            settings,
            opts,
            probes=att.probes,
            ranks=att.ranks,
            opened={"stacks": att.stacks},
            stop_signals=stops,
            **wiring.kwargs(args.tui),
        )
    )
    wiring.announce()
    try:
        if args.tui:
            from gpudiag.agent.live import run_with_tui

            result = run_with_tui(session, "attach", cmdline, pid, out, {"stacks": att.stacks})
        else:
            result = session.run()
    finally:
        if server is not None:
            server.collector.jobs = lambda: []
    finish(result, args, "attach", cmdline, pid, out, settings, wiring.recorder)
    return EXIT_OK
