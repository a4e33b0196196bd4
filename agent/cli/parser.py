"""The `gpudiag` command line's parser: every command, its options and their help."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from gpudiag.agent.cli.errors import UsageError
from gpudiag.agent.cli.evidence_options import capture_option, export_options
from gpudiag.agent.cli.options import (
    bounded,
    budget,
    positive,
    price_options,
    rate,
    settings_options,
)
from gpudiag.agent.output.report import tool_version

DESCRIPTION = """\
gpudiag tells you why your PyTorch job is slow and what to change.

It samples the job (Python stacks with py-spy, threads and DataLoader workers from /proc,
host CPU, I/O and memory pressure), works out where the training loop's wall time goes,
and reports ranked findings: the cause, the evidence, the fix with concrete values and
the expected speed-up.

Start with `gpudiag demo`. Exit codes: 0 ok; 2 bad input or a failure of gpudiag itself;
`run` passes the job's own exit code through when the job ends while profiled;
130 when interrupted before the job ended."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _profiling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--duration",
        type=positive,
        metavar="SECONDS",
        help="stop profiling after this many seconds (the job keeps running)",
    )
    p.add_argument(
        "--until-sure",
        action="store_true",
        help="stop as soon as the verdict is sure (at most --duration; the job keeps running)",
    )
    p.add_argument(
        "--out", metavar="FILE", help="report file (default: ./gpudiag-<pid>-<time>.json)"
    )
    p.add_argument(
        "--rate",
        type=rate,
        default=100,
        metavar="HZ",
        help="py-spy stack sampling rate at most (default: 100; lowered to keep "
        "within --cpu-budget)",
    )
    p.add_argument(
        "--cpu-budget",
        type=budget,
        default=3.0,
        metavar="PERCENT",
        help="CPU gpudiag and its py-spy may use, in percent of one core; sampling "
        "rates adapt to it (default: 3; 0: no limit)",
    )
    p.add_argument(
        "--window",
        type=bounded(0.5, 60.0, "seconds"),
        default=3.0,
        metavar="SECONDS",
        help="py-spy sampling window; stacks arrive once per window (default: 3)",
    )
    p.add_argument(
        "--blocking",
        action="store_true",
        help="pause the job for each stack sample (consistent stacks, higher "
        "cost to the job; the default reads without pausing; see README)",
    )
    settings_options(
        p,
        "TOML file with [thresholds] and [[rules]] (default: [tool.gpudiag] of ./pyproject.toml)",
    )
    price_options(p)
    p.add_argument(
        "--record",
        metavar="FILE",
        help="also write the run to FILE (gzip JSON Lines) for `gpudiag replay` and bug reports",
    )
    p.add_argument(
        "--record-layout",
        choices=("windows", "samples"),
        default="windows",
        help="windows: the timeline's segments (small, a day replays in seconds; default); "
        "samples: every sample (grows with the run; for probe bug reports)",
    )
    p.add_argument(
        "--record-max-mb",
        type=bounded(1.0, 1024.0 * 1024.0, "MB"),
        default=1024,
        metavar="MB",
        help="bound on the recording's size on disk: past half of it FILE is "
        "rotated to FILE.1, dropping the oldest data (default: 1024)",
    )
    p.add_argument(
        "--format",
        choices=("text", "markdown", "json"),
        default="text",
        help="summary printed on stdout at the end: text, markdown (tickets, pull "
        "requests) or json (the whole report); with markdown or json nothing "
        "else goes to stdout: a launched job's own stdout is sent to stderr "
        "(default: text)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--tui",
        action="store_true",
        help="show the live diagnosis in the terminal UI (q quits and writes the report)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    from gpudiag.agent.cli.fleet_options import add_watch_parser, metrics_options
    from gpudiag.agent.commands.tryfix import add_run_try_option, add_try_parser

    parser = _Parser(
        prog="gpudiag",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpudiag {tool_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser(
        "run",
        help="launch a job and profile it until it exits",
        description="Launch CMD, profile it until it exits (its exit code is "
        "passed through) or until --duration passes (the job then "
        "keeps running), write the report, print a summary.",
        usage="gpudiag run [options] -- CMD [ARGS...]",
    )
    _profiling_options(p)
    p.add_argument(
        "--no-inject",
        action="store_true",
        help="do not add the in-process hooks (exact step timing) to the job",
    )
    capture_option(p, "run")
    add_run_try_option(p)
    metrics_options(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command to run, after --")

    p = sub.add_parser(
        "attach",
        help="profile a running job by PID",
        description="Profile a running Python job without restarting it, "
        "until Ctrl-C, the job's exit, or --duration.",
    )
    p.add_argument("pid", help="process id of the job's Python process")
    _profiling_options(p)
    capture_option(p, "attach")
    metrics_options(p)

    add_watch_parser(sub)
    add_try_parser(sub)

    p = sub.add_parser(
        "report",
        help="render a saved report",
        description="Render a saved report as text, markdown or JSON.",
    )
    p.add_argument("file", help="a report written by gpudiag run/attach")
    p.add_argument(
        "--format",
        choices=("text", "markdown", "json", "html"),
        default="text",
        help="text (the full diagnosis with evidence), markdown (for tickets and "
        "pull requests), json (the report itself) or html (one self-contained page with "
        "the timeline, findings and flame graph; opens offline) (default: text)",
    )
    p.add_argument("--out", metavar="FILE", help="write the rendering to FILE, not stdout")
    export_options(p)
    p.add_argument("--tui", action="store_true", help="browse it in the terminal UI")

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
        choices=("text", "markdown", "json", "html"),
        default="text",
        help="summary on stdout: text, markdown, json (the whole report) or html (the "
        "self-contained page) (default: text)",
    )
    p.add_argument("--tui", action="store_true", help="browse the result in the terminal UI")
    export_options(p)

    sub.add_parser(
        "schema",
        help="print the report's JSON Schema",
        description="Print the JSON Schema every report validates against.",
    )

    sub.add_parser(
        "thresholds",
        help="list the thresholds and their defaults",
        description="List every threshold findings test against, its default "
        "and meaning. Override with --set NAME=VALUE or a config file.",
    )

    p = sub.add_parser(
        "gate",
        help="fail CI when GPU efficiency regresses against a baseline",
        description="Run the job N times under gpudiag (or take saved reports) "
        "and compare its metrics with a baseline. Exit codes: 0 "
        "pass, 1 regression, 2 usage or internal error, 3 "
        "inconclusive (too few runs, interval straddling a limit, "
        "different environment).",
        usage="gpudiag gate --baseline BASE.json [options] (-- CMD [ARGS...] | CURRENT.json ...)",
    )
    p.add_argument(
        "--baseline",
        required=True,
        metavar="FILE",
        help="a gate baseline (from --update-baseline) or a gpudiag report",
    )
    p.add_argument("--runs", type=int, metavar="N", help="runs of the job (default: config or 5)")
    p.add_argument(
        "--duration",
        type=positive,
        metavar="SECONDS",
        help="profile each run this long (default: until the job exits)",
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        metavar="N",
        help="steps left out at the start of each run (default: config or 5)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML with a [gate] table (default: [tool.gpudiag.gate] of ./pyproject.toml)",
    )
    p.add_argument(
        "--update-baseline",
        action="store_true",
        help="write the runs as the new baseline instead of comparing",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="run the job N times and suggest limits from its own noise",
    )
    p.add_argument("--exit-zero", action="store_true", help="report but exit 0 (still 2 on errors)")
    p.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML file")
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the last run's report with the comparison as one HTML page",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="report of the last run with the gate result (default: ./gpudiag-gate-<time>.json)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "reports",
        nargs="*",
        metavar="CURRENT.json",
        help="saved reports to compare (or -- CMD ARGS... to run the job; options "
        "may come before or after the reports, not after --)",
    )
    parser.gate_parser = p  # type: ignore[attr-defined]  # gate's own parser, for parse_args

    p = sub.add_parser(
        "top",
        help="the box at a glance: GPUs, host, processes to attach to",
        description="Live GPU and host panels and a table of GPU and Python "
        "processes; select one and press `a` to diagnose it.",
    )
    p.add_argument(
        "--duration",
        type=positive,
        metavar="SECONDS",
        help="after attaching with `a`, profile this long",
    )

    p = sub.add_parser(
        "demo",
        help="profile a built-in training job with a planted bottleneck",
        description="Run a small PyTorch training job whose input pipeline is "
        "starved (num_workers=0, CPU-heavy transform), profile it "
        "and show the diagnosis. Needs PyTorch; no GPU needed.",
    )
    p.add_argument(
        "--duration",
        type=positive,
        default=60.0,
        metavar="SECONDS",
        help="the most loop time to profile: it stops as soon as the verdict is sure; the "
        "clock starts at the job's first step (default: 60)",
    )
    p.add_argument("--out", metavar="FILE", help="report file (default: ./gpudiag-demo.json)")
    _merge_parser(sub)
    return parser


def _merge_parser(sub) -> None:
    """`gpudiag merge A.json B.json ... --out JOB.json`: one job report from per-host ones."""
    p = sub.add_parser(
        "merge",
        help="one job report from the reports of its hosts (or ranks)",
        description="Merge the reports each host's gpudiag wrote for its ranks into one "
        "job report: every rank in one view, the straggler analysis across hosts, the "
        "hosts' clocks aligned on the steps.",
    )
    p.add_argument("reports", nargs="+", metavar="REPORT.json", help="per-host reports")
    p.add_argument("--out", metavar="FILE", help="write the job report here")
    p.add_argument(
        "--format",
        choices=("text", "markdown", "json"),
        default="text",
        help="summary on stdout (default: text)",
    )
    settings_options(p, "thresholds from this TOML file")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The command line as a namespace. `gate` takes options before or after its report files
    (argparse's intermixed parsing); what follows `--` is the job's command, untouched."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["gate"]:
        return parser.parse_args(argv)
    rest = argv[1:]
    cmd = None
    if "--" in rest:
        i = rest.index("--")
        rest, cmd = rest[:i], rest[i + 1 :]
    gate = parser.gate_parser  # type: ignore[attr-defined]  # set by build_parser
    args = gate.parse_intermixed_args(rest)
    args.command, args.cmd = "gate", cmd
    return args
