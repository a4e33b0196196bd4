"""The `gpudiag` command line's parser: every command, its options and their help."""

from __future__ import annotations

import argparse
import sys

from gpudiag.agent.cli.commands import COMMANDS
from gpudiag.agent.commands.options import CommandParser
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command of the registry."""
    parser = CommandParser(
        prog="gpudiag",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpudiag {tool_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for command in COMMANDS:
        own = command.add_parser(sub)
        if command.name == "gate":
            parser.gate_parser = own  # type: ignore[attr-defined]  # parsed by parse_args()
    return parser


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
