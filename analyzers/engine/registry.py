"""The registered finders, in the order they run. Each takes the analysis context and the
findings made so far (the GPU idle finder explains what the host-side ones left over) and
returns its findings; `analyze` runs them all over one context, then `finalize` ranks them,
prices them and gives the verdict. A new finding goes inside the finder of its module (see
CONTRIBUTING.md); a new module's finder is added here."""

from __future__ import annotations

from collections.abc import Callable

from gpudiag.analyzers.engine.context import Context
from gpudiag.analyzers.engine.results import Finding
from gpudiag.analyzers.findings.checkpoint import checkpoint_findings
from gpudiag.analyzers.findings.data import data_findings
from gpudiag.analyzers.findings.gil import gil_findings
from gpudiag.analyzers.findings.gpu import gpu_findings
from gpudiag.analyzers.findings.host_bound import host_findings
from gpudiag.analyzers.findings.host_contention import host_contention_findings
from gpudiag.analyzers.findings.startup import startup_findings
from gpudiag.analyzers.findings.storage import io_findings
from gpudiag.analyzers.findings.sync import sync_findings
from gpudiag.analyzers.measures.gpu_stats import gpu_compute
from gpudiag.analyzers.measures.throughput import sync_sites

Finder = Callable[[Context, list[Finding]], list[Finding]]


def _data(c: Context, found: list[Finding]) -> list[Finding]:
    return data_findings(c.profile, c.metrics, c.th, c.caused("data_wait"), c.idle)


def _sync(c: Context, found: list[Finding]) -> list[Finding]:
    return sync_findings(c.metrics, sync_sites(c.view), c.th, c.cp)


def _storage(c: Context, found: list[Finding]) -> list[Finding]:
    return io_findings(c.profile, c.metrics, c.th, c.loader_d, c.caused("storage_io"))


def _gil(c: Context, found: list[Finding]) -> list[Finding]:
    return gil_findings(c.profile, c.th, c.caused("gil_wait"), c.idle)


def _checkpoint(c: Context, found: list[Finding]) -> list[Finding]:
    compute = gpu_compute(list(c.stats))
    return checkpoint_findings(c.view, c.profile, c.clf, c.th, c.caused("checkpoint"), compute)


def _host(c: Context, found: list[Finding]) -> list[Finding]:
    return host_findings(c.view, c.profile, c.clf, c.shares, c.cp, c.metrics, c.th)


def _contention(c: Context, found: list[Finding]) -> list[Finding]:
    return host_contention_findings(c.view, c.profile, c.th)


def _gpu(c: Context, found: list[Finding]) -> list[Finding]:
    return gpu_findings(list(c.stats), found, c.th, c.cp, c.metrics)


def _startup(c: Context, found: list[Finding]) -> list[Finding]:
    return startup_findings(c.phases, c.th)


FINDERS: tuple[Finder, ...] = (
    _data,
    _sync,
    _storage,
    _gil,
    _checkpoint,
    _host,
    _contention,
    _gpu,  # after the host-side finders: GPU idle they do not explain is its own finding
    _startup,
)


def run_finders(c: Context, finders: tuple[Finder, ...] = FINDERS) -> list[Finding]:
    """Every finder's findings over one context, in registration order."""
    found: list[Finding] = []
    for finder in finders:
        found += finder(c, found)
    return found
