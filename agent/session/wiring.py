"""What a profiling session is wired to, made before the session: the outputs asked for,
the recording, the metrics endpoint, the report written on a hang, and the
report and summary written at the end."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, replace

from gpudiag.agent.base.config import Settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.fleet.metrics import chain_sinks
from gpudiag.agent.fleet.server import MetricsServer, serve_job
from gpudiag.agent.output.environment import describe_environment
from gpudiag.agent.output.recording import Recorder
from gpudiag.agent.output.render.formats import render
from gpudiag.agent.output.report import report_of, write_report
from gpudiag.agent.session.session import (
    Session,
    SessionOptions,
    SessionParts,
    SessionResult,
    Subject,
)
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.gpu.probe import hardware_summary
from gpudiag.text.redact import redact_lines
from gpudiag.text.sink import emit


@dataclass(frozen=True)
class Outputs:
    """What the command asks to be written and shown (its options convert to this)."""

    format: str = "text"
    quiet: bool = False
    tui: bool = False
    record: str | None = None
    record_max_mb: float = 1024.0
    record_layout: str = "windows"
    speedscope: str | None = None
    trace: str | None = None
    stdout: bool = True  # False: no summary or file notes (an MCP server's stdout is the protocol)


def recorder_for(
    outs: Outputs, mode: str, command: list[str], pid: int, timeline: Timeline
) -> Recorder | None:
    """--record: the recorder of the session that fills `timeline`."""
    if not outs.record:
        return None
    return Recorder(
        outs.record,
        {
            "environment": describe_environment(pid, hardware_summary()),
            "run": {"mode": mode, "command": command, "pid": pid},
        },
        max_bytes=int(outs.record_max_mb * 1024 * 1024),
        layout=outs.record_layout,
        width_ns=lambda: timeline.segment_ns,  # called under the session's ingest lock
    )


class Wiring:
    """Where a session's samples and events go, made before the session itself (a recorder,
    the metrics endpoint, the report written when a multi-rank job hangs)."""

    def __init__(
        self,
        outs: Outputs,
        server: MetricsServer | None,
        subject: Subject,
        settings: Settings,
        opts: SessionOptions,
    ) -> None:
        mode, command, pid, out = subject.mode, subject.command, subject.pid, subject.out
        self.outs, self.server, self.mode = outs, server, mode
        self.command, self.pid, self.out, self.settings = command, pid, out, settings
        self.timeline = Timeline(skip_steps=opts.skip_steps)
        self.recorder = recorder_for(outs, mode, command, pid, self.timeline)
        self.session: Session | None = None  # the session built from this wiring
        self.processes: list[dict] | None = None  # a server's processes, their roles
        self.live = None
        if server is not None:
            from gpudiag.agent.session.live import live_doc

            def doc() -> dict:
                assert self.session is not None  # scraped once the session runs
                return live_doc(self.session, mode, command, pid)

            self.live = serve_job(server, doc, pid, command)

    def parts(self, given: SessionParts) -> SessionParts:
        """The session's parts: `given` (what the command has: probes, ranks, signals...)
        with this wiring's timeline, sink, log and hang report."""
        sinks = (
            self.recorder.write if self.recorder else None,
            self.live.tap if self.live else None,
        )
        parts = replace(
            given,
            timeline=self.timeline,
            sink=chain_sinks(*sinks) if any(sinks) else None,
            on_hang=self.hang_report,
        )
        if self.outs.tui:
            parts = replace(parts, log=lambda msg: None)  # the UI shows the status
        return parts

    def built(self, session: Session) -> Session:
        """The session made from parts() (the metrics endpoint reports it)."""
        self.session = session
        return session

    def announce(self) -> None:
        """Say where the metrics are served, when they are."""
        if self.server is not None and self.session and not self.outs.quiet:
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

    def finish(self, result: SessionResult, stderr_tail: list[str] | None = None) -> dict:
        """Close the recording, write the report, print the summary and where the files
        are."""
        mode, command, pid, out = self.mode, self.command, self.pid, self.out
        settings, recorder, outs = self.settings, self.recorder, self.outs
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
        doc = report_of(
            result, mode=mode, command=command, pid=pid, settings=settings, environment=env
        )
        if stderr_tail:
            doc["run"]["stderr_tail"] = redact_lines(stderr_tail)
        if self.processes:
            doc["run"]["processes"] = self.processes
        if recorder is not None and recorder.failed:
            doc["errors"].append(
                {
                    "source": "recording",
                    "message": f"recording stopped: {recorder.failed}",
                    "t": None,
                }
            )
        if self.server is not None and self.live is not None:
            self.live.settle(doc)  # the last export: the report's numbers, no analysis again
            self.server.finished(doc, self.live.labels)  # --otlp: the verdict as a log record
        try:
            path, failed = write_report(doc, out), None
        except UsageError as exc:  # disk full, folder gone: nothing half-written is left behind
            path, failed = None, str(exc)
        if outs.stdout:
            self._notes(doc, path, recorder)
        if failed:
            raise UsageError(failed)
        return doc

    def _notes(self, doc: dict, path: object, recorder: Recorder | None) -> None:
        """The summary and where the files are, on stdout (a json/markdown one on stderr)."""
        outs = self.outs
        fmt = outs.format
        print_summary(doc, fmt)  # the summary still shows what was found
        note = sys.stdout if fmt == "text" else sys.stderr  # keep a json/markdown stdout clean
        if path is not None:
            emit(
                f"Report written to {path}  (details: gpudiag report {shlex.quote(str(path))})",
                file=note,
            )
        if outs.speedscope or outs.trace:
            from gpudiag.agent.output.exports import write_exports

            for line in write_exports(doc, outs.speedscope, outs.trace):
                emit(line, file=note)
        if recorder is not None and not recorder.failed:
            replay = f"gpudiag replay {shlex.quote(recorder.path)}"
            emit(f"Recording written to {recorder.path}  ({replay})", file=note)
        elif recorder is not None:
            emit(f"gpudiag: recording {recorder.path} stopped: {recorder.failed}", file=sys.stderr)


def print_summary(doc: dict, fmt: str) -> None:
    """The summary on stdout, in one of the output formats (text: the shorter summary),
    through the outbound sink (JSON's fields are redacted where the report is built)."""
    text = render(doc, fmt, verbose=False)
    emit(text + ("\n" if fmt == "markdown" else ""), end="", redact=fmt != "json")
