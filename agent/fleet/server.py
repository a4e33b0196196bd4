"""The `/metrics` endpoint of `run`, `attach` and `watch` (prometheus_client's HTTP server on a
registry of its own: gpudiag's collector and the process collector for gpudiag's own CPU
and memory)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.fleet.identity import job_identity
from gpudiag.agent.fleet.metrics import GpudiagCollector, LiveJob

if TYPE_CHECKING:
    from gpudiag.agent.fleet.otlp import Otlp, OtlpExport

DEFAULT_ADDR = "127.0.0.1"


def check_addr(addr: str) -> str:
    """An address to listen on, or UsageError (an IP address or `localhost`)."""
    if addr == "localhost":
        return addr
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        raise UsageError(f"--metrics-addr must be an IP address, got {addr!r}") from None
    return addr


class MetricsServer:
    """The live findings served: on /metrics when a port is given, and exported over OTLP
    when an endpoint is (both read the one collector); `close()` stops them."""

    def __init__(
        self,
        addr: str,
        port: int | None,
        jobs: Callable[[], list[LiveJob]],
        health: Callable[[], dict[str, Any]] | None = None,
        otlp: Otlp | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = GpudiagCollector(jobs, health)
        self.registry.register(self.collector)
        ProcessCollector(namespace="gpudiag", registry=self.registry)
        self.addr = addr
        self.port: int | None = None
        self._server: Any = None
        if port is not None:
            try:
                self._server, self._thread = start_http_server(
                    port, addr=check_addr(addr), registry=self.registry
                )
            except OSError as exc:
                raise UsageError(
                    f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}"
                ) from None
            self.port = self._server.server_port
        self.otlp: OtlpExport | None = None
        if otlp:
            from gpudiag.agent.fleet.otlp import OtlpExport

            self.otlp = OtlpExport(
                otlp.endpoint, self.collector, gpu_uuids=gpu_uuids(), protocol=otlp.protocol
            )

    @property
    def url(self) -> str:
        """Where to scrape, and where the OTLP export goes."""
        where = []
        if self.port is not None:
            host = f"[{self.addr}]" if ":" in self.addr else self.addr
            where.append(f"http://{host}:{self.port}/metrics")
        if self.otlp is not None:
            where.append(f"OTLP {self.otlp.endpoint}")
        return " and ".join(where)

    def finished(self, doc: dict, labels: dict[str, str]) -> None:
        """A job's final report: its verdict exported as a log record (with --otlp)."""
        if self.otlp is not None:
            self.otlp.verdict(doc, labels)

    def close(self) -> None:
        """Stop serving; the OTLP export sends what is left."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
        if self.otlp is not None:
            self.otlp.close()


def gpu_uuids() -> list[str]:
    """The UUIDs of the box's GPUs (none without NVML)."""
    from gpudiag.probes.gpu.probe import hardware_summary

    try:
        return [str(g.get("uuid")) for g in hardware_summary().get("gpus") or [] if g.get("uuid")]
    except Exception:  # no driver, no NVML: no UUIDs
        return []


def open_metrics(
    port: int | None, addr: str = DEFAULT_ADDR, otlp: Otlp | None = None
) -> MetricsServer | None:
    """The endpoint of `--metrics-port` (and the `--otlp` export), listening before the job is
    launched or attached (so a port in use is a usage error before anything starts); None
    without either."""
    if port is None and not otlp:
        return None
    return MetricsServer(addr, port, lambda: [], otlp=otlp)


def serve_job(
    server: MetricsServer, report: Callable[[], dict], pid: int, command: list[str]
) -> LiveJob:
    """Serve one job's live report on `server`; the session it comes from feeds `job.tap`
    (its sink)."""
    job = LiveJob(job_identity(pid, command), report)
    server.collector.jobs = lambda: [job]
    return job
