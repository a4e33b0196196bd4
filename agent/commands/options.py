"""The option types and option groups the `gpudiag` commands share (one-line errors)."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

from gpudiag.agent.base.errors import UsageError


class CommandParser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


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


def profiling_options(p: argparse.ArgumentParser) -> None:
    """The options `run` and `attach` share: how long, how often, what to write."""
    p.add_argument(
        "--duration",
        type=positive,
        metavar="SECONDS",
        help="stop profiling after this many seconds (run: counted from the job's first "
        "step, not its start-up; the job keeps running)",
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
        default=None,
        metavar="PERCENT",
        help="CPU gpudiag and its py-spy may use, in percent of one core; sampling "
        "rates adapt to it (default: 1.5%% of the box's CPU, at least 3 and at most 50: "
        "3 on 2 cores, 24 on 16; 0: no limit)",
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


def run_try_option(p: argparse.ArgumentParser) -> None:
    """`gpudiag run --try`: diagnose, then try the fixes the findings carry."""
    p.add_argument(
        "--try",
        dest="try_fixes",
        action="store_true",
        help="after the diagnosis, try the findings' fixes as `gpudiag try --from` does "
        "(3 rounds of 10 s per arm; the report gets `trials`)",
    )
