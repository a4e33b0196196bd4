"""The registry of commands, in the order `gpudiag --help` lists them: each is a module of
`agent/commands/` with `add_parser(sub)` (its options and help) and `main(args) -> int` (its
work; the argparse Namespace ends there). A new command is a module there and a line here."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from gpudiag.agent.commands import (
    attach,
    demo,
    gate,
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


@dataclass(frozen=True)
class Command:
    """One `gpudiag` command: how its options are parsed and what it does."""

    name: str
    add_parser: Callable[[argparse._SubParsersAction], argparse.ArgumentParser | None]
    main: Callable[[argparse.Namespace], int]


def _run(args: argparse.Namespace) -> int:
    """`run`, or `run --try` (the diagnosis, then the fixes its findings carry, tried)."""
    return tryfix.main_run_try(args) if args.try_fixes else run.main(args)


COMMANDS: tuple[Command, ...] = (
    Command("run", run.add_parser, _run),
    Command("attach", attach.add_parser, attach.main),
    Command("watch", watch.add_parser, watch.main),
    Command("try", tryfix.add_parser, tryfix.main),
    Command("report", report.add_parser, report.main),
    Command("replay", replay.add_parser, replay.main),
    Command("schema", schema.add_parser, schema.main),
    Command("thresholds", thresholds.add_parser, thresholds.main),
    Command("gate", gate.add_parser, gate.main),
    Command("top", top.add_parser, top.main),
    Command("demo", demo.add_parser, demo.main),
    Command("merge", merge.add_parser, merge.main),
)
BY_NAME = {c.name: c for c in COMMANDS}
