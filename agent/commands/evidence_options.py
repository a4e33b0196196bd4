"""Command-line options of the evidence features: exports (--speedscope, --trace) and the
bounded profiler capture (--capture-steps)."""

from __future__ import annotations

import argparse

CAPTURE_HELP = {
    "run": "switch the PyTorch profiler on inside the job for N steps (after the warm-up "
    "steps), then off; its summary goes in the report's `capture` (needs the hooks)",
    "attach": "once the job's hooks connect (it called instrument()), switch the PyTorch "
    "profiler on in it for N steps; the summary goes in the report's `capture`",
}


def export_options(p: argparse._ActionsContainer) -> None:
    """--speedscope and --trace: exports other tools open, made from the report."""
    p.add_argument(
        "--speedscope",
        metavar="FILE",
        help="also write the loop thread's stacks as a speedscope profile (speedscope.app)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="also write the run's timeline (and the profiler capture) as a Chrome/Perfetto "
        "JSON trace (ui.perfetto.dev, chrome://tracing)",
    )


def capture_steps(text: str) -> int:
    """--capture-steps N: 1..1000."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps, got {text!r}") from None
    if not 1 <= v <= 1000:
        raise argparse.ArgumentTypeError(f"must be 1..1000 steps, got {v}")
    return v


def capture_option(p: argparse._ActionsContainer, command: str) -> None:
    """--capture-steps for `run` or `attach`, then the export options."""
    p.add_argument("--capture-steps", type=capture_steps, metavar="N", help=CAPTURE_HELP[command])
    export_options(p)
