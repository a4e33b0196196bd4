"""The command line's fleet options: the metrics endpoint of `run`/`attach`/`watch`, and the
`watch` subcommand."""

from __future__ import annotations

import argparse

from gpudiag.agent.cli.options import budget, positive, price_options, rate, settings_options


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port, got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535, got {v}")
    return v


def metrics_options(p: argparse.ArgumentParser, default_port: int | None = None) -> None:
    """--metrics-port and --metrics-addr."""
    p.add_argument(
        "--metrics-port",
        type=_port,
        default=default_port,
        metavar="PORT",
        help="serve the live findings as Prometheus metrics on http://ADDR:PORT/metrics"
        + (f" (default: {default_port})" if default_port else ""),
    )
    p.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="address the metrics endpoint listens on (default: 127.0.0.1; 0.0.0.0 for "
        "every interface)",
    )


def _recent(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return v


def add_watch_parser(sub: argparse._SubParsersAction) -> None:
    """The `watch` subcommand and its options."""
    p = sub.add_parser(
        "watch",
        help="node daemon: profile every PyTorch/GPU job on the box, serve /metrics",
        description="Find the GPU jobs on this box (NVML's process list, and Python "
        "processes with PyTorch loaded), profile each at a low cost within one CPU and "
        "memory budget for all of them, and serve their findings as Prometheus metrics "
        "until Ctrl-C or SIGTERM. A job that ends is dropped.",
    )
    metrics_options(p, default_port=9401)
    p.add_argument(
        "--cpu-budget",
        type=budget,
        default=10.0,
        metavar="PERCENT",
        help="CPU for all watched jobs together, in percent of one core, shared "
        "evenly between them (default: 10; 0: no limit)",
    )
    p.add_argument(
        "--memory-budget",
        type=positive,
        default=400,
        metavar="MB",
        help="resident memory for all watched jobs together (default: 400)",
    )
    p.add_argument(
        "--interval",
        type=positive,
        default=5.0,
        metavar="SECONDS",
        help="how often to look for new and ended jobs (default: 5)",
    )
    p.add_argument(
        "--recent",
        type=_recent,
        default=600.0,
        metavar="SECONDS",
        help="findings cover each job's last SECONDS, so that they follow a job that "
        "changes (default: 600; 0: the whole time it was watched)",
    )
    p.add_argument(
        "--match",
        metavar="REGEX",
        help="watch only jobs whose command line matches REGEX",
    )
    p.add_argument(
        "--duration",
        type=positive,
        metavar="SECONDS",
        help="stop after this many seconds (default: until Ctrl-C or SIGTERM)",
    )
    p.add_argument("--rate", type=rate, default=100, metavar="HZ", help="py-spy rate at most")
    p.add_argument("--window", type=positive, default=3.0, metavar="SECONDS", help="py-spy window")
    settings_options(p, "thresholds and rules, as for run")
    price_options(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no log lines on stderr")
