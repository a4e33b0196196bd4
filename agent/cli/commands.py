"""The registry of commands, in the order `gpudiag --help` lists them: each is a module of
`agent/commands/` with `add_parser(sub)` (its options and help), a frozen options type read
from the parsed arguments once (`from_args`) and `main(options) -> int` (its work). The
argparse Namespace ends here. A new command is a module there and a line here."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpudiag.agent.commands import (
    attach,
    demo,
    gate,
    mcp,
    merge,
    replay,
    report,
    run,
    schema,
    thresholds,
    top,
    tryfix,
    watch,
)
from gpudiag.agent.commands.options import FromArgs, NoOptions


@dataclass(frozen=True)
class Command:
    """One `gpudiag` command: how its options are parsed and typed, and what it does."""

    name: str
    add_parser: Callable[[argparse._SubParsersAction], argparse.ArgumentParser | None]
    options: type[FromArgs]  # a frozen dataclass: from_args(Namespace) -> its instance
    main: Callable[[Any], int]  # takes an instance of `options`

    def __call__(self, ns: argparse.Namespace) -> int:
        """Run the command on a parsed command line: its options typed, then its work."""
        return self.main(self.options.from_args(ns))


def _run(opts: run.RunOptions) -> int:
    """`run`, or `run --try` (the diagnosis, then the fixes its findings carry, tried)."""
    return tryfix.main_run_try(opts) if opts.try_fixes else run.main(opts)


COMMANDS: tuple[Command, ...] = (
    Command("run", run.add_parser, run.RunOptions, _run),
    Command("attach", attach.add_parser, attach.AttachOptions, attach.main),
    Command("watch", watch.add_parser, watch.WatchOptions, watch.main),
    Command("try", tryfix.add_parser, tryfix.TryOptions, tryfix.main),
    Command("report", report.add_parser, report.ReportOptions, report.main),
    Command("replay", replay.add_parser, replay.ReplayOptions, replay.main),
    Command("schema", schema.add_parser, NoOptions, schema.main),
    Command("thresholds", thresholds.add_parser, NoOptions, thresholds.main),
    Command("gate", gate.add_parser, gate.GateOptions, gate.main),
    Command("top", top.add_parser, top.TopOptions, top.main),
    Command("demo", demo.add_parser, demo.DemoOptions, demo.main),
    Command("merge", merge.add_parser, merge.MergeOptions, merge.main),
    Command("mcp", mcp.add_parser, mcp.McpOptions, mcp.main),
)
BY_NAME = {c.name: c for c in COMMANDS}
