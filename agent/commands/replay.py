"""`gpudiag replay`: a recording run through the analyzers into the report the live run
would have written."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from gpudiag.agent.base.config import Settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.evidence_options import export_options
from gpudiag.agent.commands.options import FromArgs, SettingsArgs, price_options, settings_options
from gpudiag.agent.commands.report import browse, exports
from gpudiag.agent.output.environment import describe_environment
from gpudiag.agent.output.recording import open_recording
from gpudiag.agent.output.render.formats import FORMATS
from gpudiag.agent.output.report import check_outputs, report_of, validate, write_report
from gpudiag.agent.session.session import SessionResult
from gpudiag.agent.session.wiring import print_summary
from gpudiag.text.sink import emit


def replay_report(path: str, settings: Settings) -> dict:
    """The report of the recording at `path`, analysed with `settings`."""
    import jsonschema

    from gpudiag.analyzers import analyze

    rec = open_recording(path)
    tl = rec.timeline()  # a stream: the file is never held in memory
    analysis = analyze(
        tl, settings.thresholds, settings.rules, settings.price, settings.price_table
    )
    foot = rec.footer or {}
    run = rec.header.get("run", {})
    errors = list(foot.get("errors", []))
    if rec.footer is None:
        errors.append(
            {
                "source": "replay",
                "message": "recording was cut short (no footer): probe status unknown",
                "t": None,
            }
        )
    result = SessionResult(
        analysis,
        rec.probes,
        errors,
        start=foot.get("start") or (tl.start_ns or 0) / 1e9,
        end=foot.get("end") or (tl.end_ns or 0) / 1e9,
        end_reason="replayed",
        exit_code=foot.get("exit_code"),
        timeline=tl,
        agent=foot.get("agent"),
    )
    environment = (
        foot.get("environment") or rec.header.get("environment") or describe_environment(None)
    )
    doc = report_of(
        result,
        mode="replay",
        command=run.get("command"),
        pid=run.get("pid"),
        settings=settings,
        environment=environment,
    )
    try:
        validate(doc)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(x) for x in exc.absolute_path) or "(top level)"
        raise UsageError(
            f"{path}: the recording's header or footer is malformed (report {where}: "
            f"{exc.message[:120]})"
        ) from None
    return doc


@dataclass(frozen=True, kw_only=True)
class ReplayOptions(FromArgs, SettingsArgs):
    """`gpudiag replay`'s options."""

    file: str
    out: str | None = None
    format: str = "text"
    tui: bool = False
    speedscope: str | None = None
    trace: str | None = None


def main(args: ReplayOptions) -> int:
    """`gpudiag replay FILE`: analyse a recording and print (and optionally write) the
    report."""
    settings = args.settings()
    check_outputs({"--out": args.out, "--speedscope": args.speedscope, "--trace": args.trace})
    doc = replay_report(args.file, settings)  # validated there
    if args.tui:
        return browse(doc, f"replay {args.file}")
    print_summary(doc, args.format)
    if args.out:
        path = write_report(doc, args.out)  # WriteError names the file; the summary stands
        emit(
            f"Report written to {path}",
            file=sys.stdout if args.format == "text" else sys.stderr,
        )
    exports(doc, args.speedscope, args.trace)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `replay` subcommand and its options."""
    p = sub.add_parser(
        "replay",
        help="analyse a recording made with --record",
        description="Run the analyzers over a recording (--record FILE) and "
        "write a report, as the live run would have.",
    )
    p.add_argument("file", help="a recording (.jsonl.gz) written by run/attach --record")
    p.add_argument("--out", metavar="FILE", help="also write the report to FILE")
    settings_options(p, "thresholds and rules, as for run")
    price_options(p)
    p.add_argument(
        "--format",
        choices=tuple(FORMATS),
        default="text",
        help="summary on stdout: text, markdown, json (the whole report) or html (the "
        "self-contained page) (default: text)",
    )
    p.add_argument("--tui", action="store_true", help="browse the result in the terminal UI")
    export_options(p)
