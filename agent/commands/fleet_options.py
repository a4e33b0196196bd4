"""The command line's fleet option: the metrics endpoint of `run`, `attach` and `watch`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gpudiag.agent.base.config import Settings
from gpudiag.agent.fleet.otlp import PROTOCOLS, Otlp, choose_protocol
from gpudiag.agent.fleet.server import DEFAULT_ADDR, MetricsServer, open_metrics


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port, got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0..65535, got {v}")
    return v


def metrics_options(p: argparse._ActionsContainer, default_port: int | None = None) -> None:
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
    p.add_argument(
        "--otlp",
        metavar="ENDPOINT",
        help="also export the metrics and the verdict over OpenTelemetry's OTLP to ENDPOINT "
        "(e.g. http://127.0.0.1:4318; [tool.gpudiag.otlp] endpoint in the config; needs pip "
        "install 'gpudiag[otlp]')",
    )
    p.add_argument(
        "--otlp-protocol",
        choices=PROTOCOLS,
        metavar="{grpc,http/protobuf}",
        help="the OTLP protocol (default: [tool.gpudiag.otlp] protocol, else "
        "$OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf); grpc sends to http://HOST:4317 "
        "and needs pip install 'gpudiag[otlp-grpc]'",
    )


@dataclass(frozen=True, kw_only=True)
class MetricsArgs:
    """--metrics-port and --metrics-addr: the metrics endpoint, when a port is given."""

    metrics_port: int | None = None
    metrics_addr: str = DEFAULT_ADDR
    otlp: str | None = None
    otlp_protocol: str | None = None

    def otlp_target(self, settings: Settings | None = None) -> Otlp | None:
        """--otlp, else the config's [otlp] endpoint, with its protocol; None without either."""
        endpoint = self.otlp or (settings.otlp_endpoint if settings is not None else None)
        if not endpoint:
            return None
        config = settings.otlp_protocol if settings is not None else None
        return Otlp(endpoint, choose_protocol(self.otlp_protocol, config))

    def open_metrics(self, settings: Settings | None = None) -> MetricsServer | None:
        """The endpoint listening and the OTLP export started (before the job starts: a port
        in use is a usage error first), or None without --metrics-port or --otlp."""
        return open_metrics(self.metrics_port, self.metrics_addr, self.otlp_target(settings))
