"""Findings over OpenTelemetry (`--otlp ENDPOINT` on run, attach and watch; the optional extra
`pip install 'gpudiag[otlp]'`): the same metric families the Prometheus endpoint serves (one
collector, agent/fleet/metrics.py, read at each export: no second path to a number) as OTLP
metrics over HTTP, and each job's verdict as a log record, under the semantic conventions'
resource attributes (service, host, process, container and Kubernetes pod from the
environment, the GPUs' UUIDs) so a collector joins them with DCGM's. The protocol is OTLP/HTTP
(protobuf) or, with `--otlp-protocol grpc` (the `gpudiag[otlp-grpc]` extra), OTLP/gRPC: the
OpenTelemetry SDK's own exporters either way."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.fleet.metrics import GpudiagCollector

TIMEOUT_S = 3  # one export's time limit (retries included)
NEEDS = "--otlp needs the OpenTelemetry SDK: pip install 'gpudiag[otlp]'"
NEEDS_GRPC = (
    "--otlp-protocol grpc needs the OpenTelemetry SDK's gRPC exporter: "
    "pip install 'gpudiag[otlp-grpc]'"
)
INTERVAL_ENV = "OTEL_METRIC_EXPORT_INTERVAL"  # OpenTelemetry's own, in ms (its default: 60 s)
HTTP, GRPC = "http/protobuf", "grpc"
PROTOCOLS = (HTTP, GRPC)  # the values of OpenTelemetry's OTEL_EXPORTER_OTLP_PROTOCOL we send
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_PROTOCOL"
# the Prometheus name's ending -> the OTLP unit (UCUM, as the semantic conventions write them)
UNITS = (
    ("_ratio", "1"),
    ("_bytes", "By"),
    ("_seconds", "s"),
    ("_seconds_total", "s"),
    ("_watts", "W"),
    ("_celsius", "Cel"),
    ("_mhz", "MHz"),
    ("_cores", "{core}"),
    ("_usd_per_hour", "{USD}/h"),
    ("_usd_per_1000_units", "{USD}"),
    ("_bytes_per_second", "By/s"),
    ("steps_per_second", "{step}/s"),
    ("_errors_total", "{error}"),
    ("_info", "1"),
    ("_up", "1"),
)
# the environment variables Kubernetes' downward API and schedulers set -> resource attributes
ENV_ATTRIBUTES = {
    "POD_NAME": "k8s.pod.name",
    "POD_NAMESPACE": "k8s.namespace.name",
    "POD_UID": "k8s.pod.uid",
    "NODE_NAME": "k8s.node.name",
    "KUBERNETES_POD_NAME": "k8s.pod.name",
    "KUBERNETES_NAMESPACE": "k8s.namespace.name",
    "SLURM_JOB_ID": "slurm.job.id",
}


def unit_of(name: str) -> str:
    """The OTLP unit of a metric from its Prometheus name's ending ("" when it has none)."""
    for end, unit in sorted(UNITS, key=lambda u: -len(u[0])):
        if name.endswith(end):
            return unit
    return ""


def metrics_url(endpoint: str) -> tuple[str, str]:
    """An OTLP/HTTP endpoint (http://host:4318) -> its metrics and logs URLs; UsageError for
    anything but an http(s) URL."""
    base = endpoint.rstrip("/")
    if not base.startswith(("http://", "https://")) or "://" == base[-3:]:
        raise UsageError(
            f"--otlp takes an OTLP/HTTP URL such as http://127.0.0.1:4318, got {endpoint!r} "
            "(OTLP/gRPC: --otlp-protocol grpc --otlp http://HOST:4317)"
        )
    for suffix in ("/v1/metrics", "/v1/logs"):
        base = base.removesuffix(suffix)
    return f"{base}/v1/metrics", f"{base}/v1/logs"


@dataclass(frozen=True)
class Otlp:
    """Where the OTLP export goes, and over which protocol (grpc or http/protobuf)."""

    endpoint: str
    protocol: str = "http/protobuf"


def check_protocol(value: str, where: str) -> str:
    """An OTLP protocol as OTEL_EXPORTER_OTLP_PROTOCOL spells it, or UsageError."""
    if value in PROTOCOLS:
        return value
    raise UsageError(f"{where} must be grpc or http/protobuf, got {value!r}")


def choose_protocol(flag: str | None, config: str | None) -> str:
    """--otlp-protocol, else the config's [otlp] protocol, else OTEL_EXPORTER_OTLP_PROTOCOL
    (every OpenTelemetry SDK's variable), else http/protobuf."""
    env = os.environ.get(PROTOCOL_ENV) or None
    sources = ((flag, "--otlp-protocol"), (config, "[otlp] protocol"), (env, PROTOCOL_ENV))
    for value, where in sources:
        if value is not None:
            return check_protocol(value.strip(), where)
    return HTTP


def export_interval_ms() -> float | None:
    """OTEL_METRIC_EXPORT_INTERVAL (ms between two exports) when set, checked; None leaves
    the SDK's default (60 s). UsageError for anything but a positive number."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = float("nan")
    if not 0 < ms < float("inf"):
        raise UsageError(f"{INTERVAL_ENV} must be a positive number of milliseconds, got {raw!r}")
    return ms


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """An OTLP/gRPC endpoint (http://host:4317, plaintext; https://host:4317, TLS) -> the
    exporter's endpoint and whether it is insecure; UsageError for anything else."""
    base = endpoint.rstrip("/")
    scheme, sep, rest = base.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest:
        raise UsageError(
            "--otlp with --otlp-protocol grpc takes http://HOST:PORT (plaintext) or "
            f"https://HOST:PORT (TLS), such as http://127.0.0.1:4317, got {endpoint!r}"
        )
    return base, scheme == "http"


def exporters(endpoint: str, protocol: str) -> tuple[Any, Any]:
    """The SDK's metric and log exporters for `endpoint` over `protocol` (UsageError with the
    extra to install when its exporter is missing)."""
    if protocol == GRPC:
        target, insecure = grpc_target(endpoint)
        try:
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
                OTLPLogExporter as GrpcLogs,
            )
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetrics,
            )
        except ImportError:
            raise UsageError(NEEDS_GRPC) from None
        return (
            GrpcMetrics(endpoint=target, insecure=insecure, timeout=TIMEOUT_S),
            GrpcLogs(endpoint=target, insecure=insecure, timeout=TIMEOUT_S),
        )
    metrics, logs = metrics_url(endpoint)
    try:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        raise UsageError(NEEDS) from None
    return (
        OTLPMetricExporter(endpoint=metrics, timeout=TIMEOUT_S),
        OTLPLogExporter(endpoint=logs, timeout=TIMEOUT_S),
    )


def container_id() -> str | None:
    """The container this process runs in, from its cgroup (None outside one)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                tail = line.strip().rsplit("/", 1)[-1]
                tail = tail.removeprefix("docker-").removeprefix("cri-containerd-")
                tail = tail.removesuffix(".scope")
                if len(tail) == 64 and all(c in "0123456789abcdef" for c in tail):
                    return tail
    except OSError:
        pass
    return None


def resource_attributes(gpu_uuids: Iterable[str] = ()) -> dict[str, Any]:
    """The semantic conventions' resource attributes of this agent and its box."""
    from gpudiag.agent.output.report import tool_version

    attrs: dict[str, Any] = {
        "service.name": "gpudiag",
        "service.version": tool_version(),
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
        "process.runtime.name": "cpython",
    }
    for var, key in ENV_ATTRIBUTES.items():
        if os.environ.get(var) and key not in attrs:
            attrs[key] = os.environ[var]
    if cid := container_id():
        attrs["container.id"] = cid
    uuids = sorted({u for u in gpu_uuids if u})
    if uuids:
        attrs["gpu.uuids"] = uuids  # each GPU's series carries its own UUID attribute too
    return attrs


class OtlpExport:
    """Exports the collector's metric families every `interval_s` (by default as every
    OpenTelemetry SDK does: OTEL_METRIC_EXPORT_INTERVAL, else 60 s) from the SDK's periodic
    reader thread, and the verdicts as log records; `close()` sends what is left and stops.
    Each export reads the collector once (a live analysis of each job): its cost is one
    analysis per interval, whatever the sampling rate."""

    def __init__(
        self,
        endpoint: str,
        collector: GpudiagCollector,
        interval_s: float | None = None,
        gpu_uuids: Iterable[str] = (),
        protocol: str = HTTP,
    ) -> None:
        try:
            from opentelemetry.sdk._logs import LoggerProvider
            from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
        except ImportError:
            raise UsageError(NEEDS_GRPC if protocol == GRPC else NEEDS) from None
        interval_ms = export_interval_ms() if interval_s is None else interval_s * 1000
        metric_exporter, log_exporter = exporters(endpoint, check_protocol(protocol, "protocol"))
        # the SDK's retry warnings stay off the job's terminal; a failed export is one line
        logging.getLogger("opentelemetry").setLevel(logging.ERROR)
        self.endpoint = endpoint if protocol == HTTP else f"{endpoint} (gRPC)"
        self.collector = collector
        self.resource = Resource.create(resource_attributes(gpu_uuids))
        reader = PeriodicExportingMetricReader(
            metric_exporter,
            export_interval_millis=interval_ms,  # None: the SDK's default, 60 s
        )
        self.meters = MeterProvider(resource=self.resource, metric_readers=[reader])
        self.logs = LoggerProvider(resource=self.resource)
        self.logs.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
        self._lock = threading.Lock()
        self._snap: dict[str, list[tuple[dict[str, str], float]]] = {}
        self._at = float("-inf")
        self._instruments()

    def _instruments(self) -> None:
        """One observable instrument per series name the collector can give."""
        meter = self.meters.get_meter("gpudiag")
        empty = GpudiagCollector(lambda: [], self.collector.health)
        for fam in empty.collect():
            name = fam.name + {"counter": "_total", "info": "_info"}.get(fam.type, "")
            make = (
                meter.create_observable_counter
                if fam.type == "counter"
                else meter.create_observable_gauge
            )
            doc = fam.documentation
            make(name, callbacks=[self._callback(name)], unit=unit_of(name), description=doc)

    def _callback(self, name: str) -> Callable[[Any], list]:
        from opentelemetry.metrics import Observation

        def observe(options: Any) -> list:
            return [Observation(v, labels) for labels, v in self.snapshot().get(name, [])]

        return observe

    def snapshot(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Every series now (read once per export, not once per instrument)."""
        with self._lock:
            if time.monotonic() - self._at > 1.0:
                snap: dict[str, list[tuple[dict[str, str], float]]] = {}
                for fam in self.collector.collect():
                    for s in fam.samples:
                        if not s.name.endswith("_created"):
                            snap.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
                self._snap, self._at = snap, time.monotonic()
            return self._snap

    def verdict(self, doc: dict, labels: dict[str, str]) -> None:
        """A job's verdict as one log record (INFO when healthy, WARN when a finding stands)."""
        from opentelemetry._logs import SeverityNumber

        v = doc.get("verdict") or {}
        top = v.get("finding")
        attrs: dict[str, Any] = {k: str(val) for k, val in labels.items() if val}
        attrs |= {"gpudiag.verdict.sure": bool(v.get("sure"))}
        if top:
            attrs["gpudiag.verdict.finding"] = str(top)
        if v.get("confidence") is not None:
            attrs["gpudiag.verdict.confidence"] = float(v["confidence"])
        if (pid := (doc.get("run") or {}).get("pid")) is not None:
            attrs["process.pid"] = int(pid)
        self.logs.get_logger("gpudiag").emit(
            severity_number=SeverityNumber.WARN if top else SeverityNumber.INFO,
            severity_text="WARN" if top else "INFO",
            body=str(v.get("statement") or "no verdict"),
            attributes=attrs,
            event_name="gpudiag.verdict",
        )

    def close(self) -> None:
        """Send the last metrics and the log records, then stop (each within its timeout:
        an endpoint that does not answer delays the exit by seconds, never the report)."""
        self.meters.shutdown(timeout_millis=TIMEOUT_S * 1000)
        self.logs.shutdown()
