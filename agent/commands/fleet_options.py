"""The command line's fleet option: the metrics endpoint of `run`, `attach` and `watch`."""

from __future__ import annotations

import argparse


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
