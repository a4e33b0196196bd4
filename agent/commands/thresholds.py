"""`gpudiag thresholds`: every threshold findings test against, its default, unit, range and
meaning."""

from __future__ import annotations

import argparse

from gpudiag.agent.commands.options import NoOptions
from gpudiag.analyzers.model.thresholds import RANGES, Thresholds
from gpudiag.text.sink import emit


def main(opts: NoOptions) -> int:
    """Print each threshold, its default, unit and range, and its meaning."""
    defaults = Thresholds().to_dict()
    for name, doc in Thresholds.names().items():
        unit = Thresholds.unit(name)
        emit(f"{name} = {defaults[name]}  ({RANGES[unit]})\n    {doc}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `thresholds` subcommand."""
    sub.add_parser(
        "thresholds",
        help="list the thresholds and their defaults",
        description="List every threshold findings test against, its default "
        "and meaning. Override with --set NAME=VALUE or a config file.",
    )
