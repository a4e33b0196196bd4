"""The `/metrics` endpoint of `run`, `attach` and `watch` (prometheus_client's HTTP server on a
registry of its own: gpudiag's collector and the process collector for gpudiag's own CPU
and memory)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.fleet.identity import job_identity
from gpudiag.agent.fleet.metrics import GpudiagCollector, LiveJob

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
    """A running endpoint; `close()` stops it."""

    def __init__(
        self,
        addr: str,
        port: int,
        jobs: Callable[[], list[LiveJob]],
        health: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = GpudiagCollector(jobs, health)
        self.registry.register(self.collector)
        ProcessCollector(namespace="gpudiag", registry=self.registry)
        try:
            self._server, self._thread = start_http_server(
                port, addr=check_addr(addr), registry=self.registry
            )
        except OSError as exc:
            raise UsageError(
                f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}"
            ) from None
        self.addr = addr
        self.port = self._server.server_port

    @property
    def url(self) -> str:
        """Where to scrape."""
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def open_metrics(port: int | None, addr: str = DEFAULT_ADDR) -> MetricsServer | None:
    """The endpoint of `--metrics-port`, listening before the job is launched or attached
    (so a port in use is a usage error before anything starts); None without a port."""
    if port is None:
        return None
    return MetricsServer(addr, port, lambda: [])


def serve_job(
    server: MetricsServer, report: Callable[[], dict], pid: int, command: list[str]
) -> LiveJob:
    """Serve one job's live report on `server`; the session it comes from feeds `job.tap`
    (its sink)."""
    job = LiveJob(job_identity(pid, command), report)
    server.collector.jobs = lambda: [job]
    return job
