"""Bad input: one clear line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--tui", "--", "python"],
        ["attach", "1", "--tui"],
        ["report", "r.json", "--tui"],
        ["replay", "r.jsonl.gz", "--tui"],
        ["top"],
    ],
)
def test_every_view_parses(argv):
    from gpudiag.agent.cli.main import build_parser

    args = build_parser().parse_args(argv)
    assert getattr(args, "tui", True) is True
