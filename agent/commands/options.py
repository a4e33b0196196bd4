"""The option types and option groups the `gpudiag` commands share (one-line errors), and
the typed options they are read into once (`from_args`): below the command nothing sees
the argparse Namespace, as py-spy's `Config::from_args`."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NoReturn, TypeVar

from gpudiag.agent.base.config import Settings, load_settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.evidence_options import capture_option
from gpudiag.agent.commands.fleet_options import MetricsArgs, metrics_options
from gpudiag.agent.output.render.formats import SUMMARIES
from gpudiag.agent.output.report import check_outputs
from gpudiag.agent.session.budget import default_cpu_budget
from gpudiag.agent.session.setup import SessionOptions
from gpudiag.agent.session.wiring import Outputs

Group = argparse._ActionsContainer  # a parser or one of its argument groups
Opts = TypeVar("Opts")


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


def bounded(low: float, high: float, unit: str) -> Callable[[str], float]:
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


def price_options(p: Group) -> None:
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


def settings_options(p: Group, config_help: str) -> None:
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


def profiling_options(p: argparse.ArgumentParser, command: str) -> dict[str, Group]:
    """The options `run` and `attach` share, in groups (stop, sampling, thresholds and
    prices, output, evidence, fleet); the groups by name, for the command's own options."""
    groups: dict[str, Group] = {
        "stop": p.add_argument_group("stop", "when the look ends (default: when the job does)"),
        "sampling": p.add_argument_group("sampling", "how the job is sampled, at what cost"),
        "settings": p.add_argument_group("thresholds and prices"),
        "output": p.add_argument_group("output", "the report, the summary, the recording"),
        "evidence": p.add_argument_group("evidence", "exports and the profiler capture"),
        "fleet": p.add_argument_group("fleet", "the live findings as Prometheus metrics"),
    }
    stop_options(groups["stop"])
    sampling_options(groups["sampling"])
    settings_options(
        groups["settings"],
        "TOML file with [thresholds] and [[rules]] (default: [tool.gpudiag] of ./pyproject.toml)",
    )
    price_options(groups["settings"])
    output_options(groups["output"])
    capture_option(groups["evidence"], command)
    metrics_options(groups["fleet"])
    return groups


def stop_options(p: Group) -> None:
    """--duration and --until-sure."""
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


def sampling_options(p: Group) -> None:
    """--rate, --cpu-budget, --window and --blocking."""
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


def output_options(p: Group) -> None:
    """--out, the recording's options, --format, --quiet and --tui."""
    p.add_argument(
        "--out", metavar="FILE", help="report file (default: ./gpudiag-<pid>-<time>.json)"
    )
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
        choices=SUMMARIES,
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


def from_namespace(cls: type[Opts], ns: argparse.Namespace) -> Opts:
    """`cls` (a frozen dataclass) from the parsed arguments of its fields' names, lists made
    tuples; a field the parser has no argument for is a bug (AttributeError)."""
    given: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]  # a dataclass type
        value = getattr(ns, f.name)
        given[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**given)


class FromArgs:
    """A command's options, typed: read from its parsed arguments once, by their names."""

    @classmethod
    def from_args(cls: type[Opts], ns: argparse.Namespace) -> Opts:
        """The options of a parsed command line."""
        return from_namespace(cls, ns)


@dataclass(frozen=True)
class NoOptions(FromArgs):
    """The options of a command that takes none (`schema`, `thresholds`)."""


@dataclass(frozen=True, kw_only=True)
class SettingsArgs:
    """--config, --set, --price and --prices: the thresholds, rules and prices."""

    config: str | None = None
    overrides: tuple[str, ...] | None = None
    price: float | None = None
    prices: str | None = None

    def settings(self) -> Settings:
        """The settings they name, read and checked (UsageError with one line)."""
        overrides = list(self.overrides) if self.overrides is not None else None
        return load_settings(self.config, overrides, price=self.price, prices_file=self.prices)


@dataclass(frozen=True, kw_only=True)
class ProfilingOptions(FromArgs, SettingsArgs, MetricsArgs):
    """The options `run` and `attach` share, by --help's groups."""

    # stop
    duration: float | None = None
    until_sure: bool = False
    # sampling
    rate: int = 100
    cpu_budget: float | None = None  # percent of one core; None: the box's default
    window: float = 3.0
    blocking: bool = False
    # output
    out: str | None = None
    record: str | None = None
    record_layout: str = "windows"
    record_max_mb: float = 1024.0
    format: str = "text"
    quiet: bool = False
    tui: bool = False
    # evidence
    capture_steps: int | None = None
    speedscope: str | None = None
    trace: str | None = None

    def session(self, attached: bool = False, load_hooks: bool = False) -> SessionOptions:
        """The session's sampling options (`attached`: the job runs already, and a
        --capture-steps is asked of its hooks once they connect)."""
        budget = self.cpu_budget
        cores = default_cpu_budget(os.cpu_count()) if budget is None else budget / 100.0
        return SessionOptions(
            attached=attached,
            capture_steps=self.capture_steps if attached else None,
            load_hooks=load_hooks if attached else False,
            duration_s=self.duration,
            rate_hz=self.rate,
            window_s=self.window,
            nonblocking=not self.blocking,
            progress=not self.quiet,
            cpu_budget=cores or None,
            until_sure=self.until_sure,
        )

    def outputs(self) -> Outputs:
        """What is written and shown."""
        return Outputs(
            format=self.format,
            quiet=self.quiet,
            tui=self.tui,
            record=self.record,
            record_max_mb=self.record_max_mb,
            record_layout=self.record_layout,
            speedscope=self.speedscope,
            trace=self.trace,
        )

    def check_outputs(self) -> None:
        """Fail before profiling when an output could not be written, or two name one file."""
        check_outputs(
            {"--out": self.out, "--record": self.record, "--speedscope": self.speedscope}
            | {"--trace": self.trace}
        )
