"""`gpudiag report FILE`: a saved report rendered in any output format, or browsed in the
terminal UI; the exports (speedscope, Perfetto) `report` and `replay` write."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from gpudiag.agent.commands.evidence_options import export_options
from gpudiag.agent.commands.options import FromArgs
from gpudiag.agent.output.render.formats import FORMATS, render
from gpudiag.agent.output.report import check_writable, load_report, reading
from gpudiag.text.sink import emit, outbound

EXIT_OK = 0


@dataclass(frozen=True)
class ReportOptions(FromArgs):
    """`gpudiag report`'s options."""

    file: str
    format: str = "text"
    out: str | None = None
    speedscope: str | None = None
    trace: str | None = None
    tui: bool = False


def main(args: ReportOptions) -> int:
    """`gpudiag report FILE`: render a saved report."""
    doc = load_report(args.file)
    if args.out:
        check_writable(args.out)
    if args.tui:
        return browse(doc, f"report {args.file}")
    with reading(args.file):
        text = render(doc, args.format)
    text = outbound(text, redact=args.format != "json")  # a file someone will `cat`, too
    if args.out:
        from gpudiag.agent.output.exports import write_text

        where = write_text(text, args.out, what=f"{args.format} report")
        emit(f"{args.format} written to {where}", file=sys.stderr)
    else:
        emit(text, end="", redact=args.format != "json")
    exports(doc, args.speedscope, args.trace, source=args.file)
    return EXIT_OK


def exports(
    doc: dict, speedscope: str | None, trace: str | None, source: str | None = None
) -> None:
    """Write --speedscope / --trace when asked; say where on stderr. `source`: the file the
    report was read from (its wrongly typed fields are then one line, see `reading`)."""
    if speedscope or trace:
        from gpudiag.agent.output.exports import write_exports

        for path in (speedscope, trace):
            if path:
                check_writable(path)
        if source is None:
            lines = write_exports(doc, speedscope, trace)
        else:
            with reading(source):
                lines = write_exports(doc, speedscope, trace)
        for line in lines:
            emit(line, file=sys.stderr)


def browse(doc: dict, title: str) -> int:
    """Browse a report in the terminal UI."""
    from gpudiag.tui.app import DiagnosisApp
    from gpudiag.tui.feeds import static_feed

    DiagnosisApp(static_feed(doc, title)).run()
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `report` subcommand and its options."""
    p = sub.add_parser(
        "report",
        help="render a saved report",
        description="Render a saved report as text, markdown or JSON.",
    )
    p.add_argument("file", help="a report written by gpudiag run/attach")
    p.add_argument(
        "--format",
        choices=tuple(FORMATS),
        default="text",
        help="text (the full diagnosis with evidence), markdown (for tickets and "
        "pull requests), json (the report itself) or html (one self-contained page with "
        "the timeline, findings and flame graph; opens offline) (default: text)",
    )
    p.add_argument("--out", metavar="FILE", help="write the rendering to FILE, not stdout")
    export_options(p)
    p.add_argument("--tui", action="store_true", help="browse it in the terminal UI")
