"""`gpudiag schema`: the JSON Schema every report validates against."""

from __future__ import annotations

import argparse

from gpudiag.agent.commands.options import NoOptions
from gpudiag.agent.output.report import schema_text
from gpudiag.text.sink import emit


def main(opts: NoOptions) -> int:
    """Print the schema."""
    emit(schema_text(), end="", redact=False)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `schema` subcommand."""
    sub.add_parser(
        "schema",
        help="print the report's JSON Schema",
        description="Print the JSON Schema every report validates against.",
    )
