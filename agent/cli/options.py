"""The option types and option groups the `gpudiag` commands share (one-line errors)."""

from __future__ import annotations

import argparse
import math


def positive(value: str) -> float:
    """An argparse type: seconds, a finite number more than 0."""
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not v > 0 or not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number more than 0, got {value!r}")
    return v


def bounded(low: float, high: float, unit: str):
    """An argparse type: a number from `low` to `high` (in `unit`)."""

    def parse(value: str) -> float:
        try:
            v = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {unit}, got {value!r}") from None
        if not low <= v <= high:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be {low:g} to {high:g} {unit}, got {value!r}")
        return v

    return parse


def price(value: str) -> float:
    """An argparse type: a finite USD-per-GPU-hour price."""
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected USD per GPU-hour, got {value!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite price, got {value!r}")
    return v


def rate(value: str) -> int:
    """An argparse type: a sampling rate, 1 to 1000 Hz."""
    try:
        v = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected samples per second, got {value!r}") from None
    if not 1 <= v <= 1000:
        raise argparse.ArgumentTypeError(f"must be 1..1000 Hz, got {v}")
    return v


def price_options(p: argparse.ArgumentParser) -> None:
    """--price and --prices: the money figures' GPU-hour price."""
    p.add_argument(
        "--price",
        type=price,
        metavar="USD_PER_GPU_HOUR",
        help="GPU-hour price for the money figures (default: [tool.gpudiag.prices]"
        ", else the built-in reference table)",
    )
    p.add_argument(
        "--prices",
        metavar="FILE",
        help="TOML file with a [prices] table: GPU model key or name = USD/GPU-hour",
    )


def settings_options(p: argparse.ArgumentParser, config_help: str) -> None:
    """--config FILE and --set NAME=VALUE (repeatable): thresholds and rules."""
    p.add_argument("--config", metavar="FILE", help=config_help)
    p.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        dest="overrides",
        help="override one threshold, e.g. --set data_wait_warn=0.2 (repeatable)",
    )


def budget(text: str) -> float:
    """An argparse type: a CPU budget, a percentage of one core (0 to 100)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 100:  # also refuses nan
        raise argparse.ArgumentTypeError("give a percentage of one core, 0 to 100")
    return value
