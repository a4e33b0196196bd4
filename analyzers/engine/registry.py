"""The registry of finders, in the order they run. A finder is a findings module's
`find(ctx) -> list[Finding]` over the one analysis context (`engine/context.py`, built once
per analysed span); the context's `found` holds the findings made before it (the GPU finder
explains the GPU idle the host-side ones left over). `analyze` runs them all, then
`finalize` ranks them, prices them and gives the verdict. A new finding goes inside the
`find` of its family's module (see CONTRIBUTING.md); a new family's module is added here.
The passes that add findings after the analysis (a distributed job's ranks, `merge`) rank
them in through `finalize.with_more`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpudiag.analyzers.engine.context import Context
from gpudiag.analyzers.engine.results import Finding
from gpudiag.analyzers.findings import (
    checkpoint,
    data,
    evaluation,
    gil,
    gpu,
    host_bound,
    host_contention,
    oversubscription,
    serving,
    startup,
    storage,
    sync,
    unexplained,
)

Finder = Callable[[Context], list[Finding]]

FINDERS: tuple[Finder, ...] = (
    data.find,
    evaluation.find,  # before SYNC001: the syncs an evaluation pass makes are EVAL001's
    sync.find,
    storage.find,
    gil.find,
    checkpoint.find,
    serving.find,  # before HOST001: a server's or batch-1 inference's host time is theirs
    host_bound.find,
    host_contention.find,
    oversubscription.find,
    unexplained.find,  # after every host-side cause: the loop time none of them explains
    gpu.find,  # after the host-side finders: GPU idle they do not explain is its own finding
    startup.find,
)


def run_finders(c: Context, finders: tuple[Finder, ...] = FINDERS) -> list[Finding]:
    """Every finder's findings over one context, in registration order."""
    found: list[Finding] = []
    for finder in finders:
        found += finder(replace(c, found=tuple(found)))
    return found
