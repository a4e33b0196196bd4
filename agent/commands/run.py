"""`gpudiag run -- CMD`: launch the job with the in-process hooks, profile it until it exits
(or --duration), pass the user's signals on, and never leave the job orphaned."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpudiag.agent.base.config import Settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.options import (
    ProfilingOptions,
    profiling_options,
    run_try_option,
)
from gpudiag.agent.fleet.server import MetricsServer
from gpudiag.agent.output.report import check_outputs, check_writable, default_report_name
from gpudiag.agent.session.joboutput import StderrTee, job_log_path
from gpudiag.agent.session.launch import Job, launch
from gpudiag.agent.session.session import Session, SessionParts, SessionResult, Subject
from gpudiag.agent.session.signals import StopSignals
from gpudiag.agent.session.wiring import Wiring
from gpudiag.agent.session.workers import roles_of
from gpudiag.probes.inject.gpudiag_channel import CAPTURE_ENV
from gpudiag.text.redact import redact_argv
from gpudiag.text.sink import emit

EXIT_OK, EXIT_USAGE, EXIT_INTERRUPTED = 0, 2, 130


@dataclass(frozen=True, kw_only=True)
class RunOptions(ProfilingOptions):
    """`gpudiag run`'s options: the profiling ones, the job's command and how it is launched."""

    cmd: tuple[str, ...] = ()  # as given: a leading `--` is dropped by `command`
    no_inject: bool = False
    try_fixes: bool = False

    @property
    def command(self) -> list[str]:
        """The job's command (what follows `--`)."""
        command = list(self.cmd)
        return command[1:] if command[:1] == ["--"] else command


def capture_env(opts: RunOptions) -> dict[str, str]:
    """The job's environment for `--capture-steps N` (empty without it)."""
    n = opts.capture_steps
    if not n:
        return {}
    if opts.no_inject:
        raise UsageError("--capture-steps needs the in-process hooks: drop --no-inject")
    return {CAPTURE_ENV: str(n)}


def run_job(
    opts: RunOptions,
    command: list[str],
    settings: Settings,
    on_launch: Callable[[int], None] | None = None,
    on_report: Callable[[dict], None] | None = None,
) -> int:
    """Launch the job, profile it, write the report; the job's exit code (or ours). Under
    the terminal UI the job's stdout and stderr go to its log panel and a file. `on_launch`
    is told the job's PID once it started (`try` ends the job its diagnosis left running),
    `on_report` the report as computed (`try` never reads the file back)."""
    log_path = job_log_path(opts.out) if opts.tui else None
    if log_path:
        check_writable(log_path)
    server = opts.open_metrics(settings)
    launched: list[Job] = []

    def pass_on(signum: int, count: int) -> None:
        # SIGTERM and SIGHUP stop the run: the job gets them too, as it would without
        # gpudiag (a terminal's Ctrl-C already reaches the whole foreground group)
        if signum != signal.SIGINT and launched and launched[0].popen.returncode is None:
            os.kill(launched[0].popen.pid, signum)

    # the handlers go in before the job starts: a SIGTERM in between still gets the report,
    # and the job gets it too (it killed gpudiag and orphaned the job)
    with StopSignals(pass_on) as stops:
        job, err_r = _launch(opts, command, log_path, server)
        launched.append(job)
        if on_launch is not None:
            on_launch(job.popen.pid)
        if stops.signum is not None:
            pass_on(stops.signum, stops.count)  # it came before the job existed
        tee = StderrTee(err_r, log_path)
        if not opts.tui:
            try:
                around = Around(tee, server, stops, on_report=on_report)
                return _profile_launched(opts, job, settings, around)
            finally:
                tee.close()
    try:  # the UI handles SIGTERM/SIGHUP itself, and passes them on too
        around = Around(tee, server, pass_on=pass_on, on_report=on_report)
        return _profile_launched(opts, job, settings, around)
    finally:
        tee.close()


def _launch(
    opts: RunOptions, command: list[str], log_path: str | None, server: Any
) -> tuple[Job, int]:
    """The job started, and the pipe its stderr (under the UI, its stdout too) goes into."""
    # a machine-readable summary is all that goes to stdout: the job's stdout goes to stderr
    job_stdout = None if opts.format == "text" else sys.stderr.fileno()
    err_r, err_w = os.pipe()
    try:
        job = launch(
            command,
            inject=not opts.no_inject,
            stdout=err_w if log_path else job_stdout,
            stderr=err_w,
            extra_env=capture_env(opts),
        )
    except BaseException:
        os.close(err_r)
        if server is not None:
            server.close()
        raise
    finally:
        os.close(err_w)
    return job, err_r


@dataclass(frozen=True)
class Around:
    """What `run` set up around the launched job: the tee of its stderr, the metrics server,
    and how signals reach the job: `stops` (the signals as a flag, without the UI) or
    `pass_on` (the UI's handlers pass them on)."""

    tee: StderrTee
    server: MetricsServer | None = None
    stops: StopSignals | None = None
    pass_on: Callable[[int, int], None] | None = None
    on_report: Callable[[dict], None] | None = None  # told the report as computed


def _profile_launched(opts: RunOptions, job: Job, settings: Settings, around: Around) -> int:
    popen, command = job.popen, job.command
    out = opts.out or default_report_name(popen.pid, time.time())
    sampling = opts.session()
    found = job.find_target()
    subject = Subject("run", command, found[0], out)
    wiring = Wiring(opts.outputs(), around.server, subject, settings, sampling)
    parts = wiring.parts(SessionParts(stop_signals=around.stops))
    session = wiring.built(job.session(settings, sampling, found, parts))
    if not opts.quiet:
        session.log(
            f"profiling pid {popen.pid} ({' '.join(redact_argv(command) or [])})"
            + (
                f" for {opts.duration:.0f} s of its loop (counted from its first step)"
                if opts.duration
                else " until it exits"
            )
        )
    wiring.announce()
    passed: list[int] = []  # signals the UI passed on to the job
    try:
        result = _run_session(opts, session, subject, job, around, passed)
        failed = result.exit_code not in (None, 0)
        if session.roles is not None:  # a server's work followed into a child: who does what
            wiring.processes = roles_of(session.target.pid) or session.roles
        doc = wiring.finish(result, stderr_tail=around.tee.lines() if failed else None)
    finally:  # after the report: --otlp sends its verdict
        if around.server is not None:
            around.server.close()
    if around.on_report is not None:  # `try` keeps the report as computed, in memory
        around.on_report(doc)
    if result.end_reason == "duration_reached" and session.first_step_at is None:
        emit(
            f"gpudiag: no step of the job's loop in {opts.duration:g} s: the look saw its "
            "start-up only (give a longer --duration)",
            file=sys.stderr,
        )
    if result.end_reason in ("duration_reached", "verdict_sure"):
        emit(f"gpudiag: profiling done; the job (pid {popen.pid}) keeps running", file=sys.stderr)
        return EXIT_OK
    return _exit_code(opts, job, result, around, passed)


def _run_session(
    opts: RunOptions,
    session: Session,
    subject: Subject,
    job: Job,
    around: Around,
    passed: list[int],
) -> SessionResult:
    """The session run, behind the UI with --tui (the signals its handlers pass on to the job
    are added to `passed`)."""
    if not opts.tui:
        return session.run()
    from gpudiag.agent.session.live import JobView, run_with_tui

    relay = None
    pass_on = around.pass_on
    if pass_on is not None:

        def relay(signum: int, count: int) -> None:
            passed.append(signum)
            pass_on(signum, count)

    view = JobView(job.popen, around.tee.take_lines, around.tee.log_path)
    return run_with_tui(session, subject, pass_on=relay, job=view)


def _exit_code(
    opts: RunOptions, job: Job, result: SessionResult, around: Around, passed: list[int]
) -> int:
    """The exit code of `run` once the job ended (or the session did): the job's, passed
    through; the job is never left orphaned when the user stopped the look."""
    popen, stops = job.popen, around.stops
    code = result.exit_code
    if code is None and popen.poll() is not None:
        code = popen.returncode  # it ended after the session's last look: its code stands
    if around.tee.log_path:
        emit(f"gpudiag: the job's output is in {around.tee.log_path}", file=sys.stderr)
    if code is None and (passed or opts.tui) and popen.poll() is not None:
        code = popen.returncode  # it ended on the signal the UI passed on, or on q
    if code is None and popen.poll() is None and (stops is not None or passed or opts.tui):
        # never leave the job orphaned: wait for it, unless the user interrupts again
        emit(
            f"gpudiag: waiting for the job (pid {popen.pid}) to exit "
            "(interrupt again to leave it running)",
            file=sys.stderr,
            flush=True,
        )
        if stops is not None:
            code = popen.wait()
        else:  # after the UI: its handlers are gone; a new one passes on, a second exits
            with StopSignals(around.pass_on) as again:
                again.count = 1 if passed else 0  # after q: one more interrupt is the first
                code = popen.wait()
    if code is not None:
        return code if code >= 0 else 128 - code
    return EXIT_INTERRUPTED if result.end_reason == "interrupted" else EXIT_OK


def prepare(opts: RunOptions) -> tuple[list[str], Settings]:
    """The job's command and the settings, checked: one line and exit 2 when wrong."""
    command = opts.command
    if not command:
        raise UsageError("run needs a command after --, e.g. gpudiag run -- python train.py")
    settings = opts.settings()
    opts.check_outputs()
    if opts.tui:  # the job's log beside the report is an output too
        check_outputs(
            {"--out": opts.out, "--record": opts.record, "--speedscope": opts.speedscope}
            | {"--trace": opts.trace, "the job's log (--tui)": job_log_path(opts.out)}
        )
    return command, settings


def main(
    opts: RunOptions,
    on_launch: Callable[[int], None] | None = None,
    on_report: Callable[[dict], None] | None = None,
) -> int:
    """`gpudiag run`: launch the job, profile it, write the report; pass the job's exit code
    through (`run --try` is routed to the try command by the command registry; `on_launch`
    and `on_report`: see run_job)."""
    command, settings = prepare(opts)
    return run_job(opts, command, settings, on_launch, on_report)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `run` subcommand and its options."""
    p = sub.add_parser(
        "run",
        help="launch a job and profile it until it exits",
        description="Launch CMD, profile it until it exits (its exit code is "
        "passed through) or until --duration passes (the job then "
        "keeps running), write the report, print a summary.",
        usage="gpudiag run [options] -- CMD [ARGS...]",
    )
    groups = profiling_options(p, "run")
    groups["sampling"].add_argument(
        "--no-inject",
        action="store_true",
        help="do not add the in-process hooks (exact step timing) to the job",
    )
    run_try_option(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")
