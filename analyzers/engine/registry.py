"""The registry of finders, in the order they run. A finder is a findings module's
`find(ctx) -> list[Finding]` over the one analysis context (`context/context.py`, built once
per analysed span); the context's `found` holds the findings made before it (the GPU finder
explains the GPU idle the host-side ones left over). `analyze` runs them all, then
`finalize` ranks them, prices them and gives the verdict. A new finding goes inside the
`find` of its family's module (see CONTRIBUTING.md); a new family's module is added here.

The findings decided after the analysis, over more than one context, come from the second
passes registered here too (`SECOND_PASSES`): each a function over its one typed input that
returns `Passed` (its findings and its part of the report). A session ranks a pass's findings
in with `finalize.with_more`; a pass over report documents returns them ranked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.distributed.passes import (
    RanksSeen,
    ReportsMerged,
    merged_findings,
    rank_findings,
)
from gpudiag.analyzers.findings import (
    checkpoint,
    data,
    debug_switches,
    evaluation,
    gil,
    gpu,
    host_bound,
    host_contention,
    model_load,
    oversubscription,
    padding,
    serving,
    startup,
    storage,
    sync,
    unexplained,
)
from gpudiag.analyzers.measures.capture import CaptureSeen, capture_findings
from gpudiag.analyzers.model.results import F, Finding, Passed

Finder = Callable[[Context], list[Finding]]

FINDERS: tuple[Finder, ...] = (
    oversubscription.find,  # before data: batches late from the job's own crowded pools
    data.find,
    evaluation.find,  # before SYNC001: the syncs an evaluation pass makes are EVAL001's
    sync.find,
    debug_switches.find,  # before HOST001: the stack records' host time is DEBUG001's
    storage.find,
    gil.find,
    checkpoint.find,
    model_load.find,  # before serving: the handlers' loading is not SERVE002's host work
    serving.find,  # before HOST001: a server's or batch-1 inference's host time is theirs
    padding.find,
    host_bound.find,
    host_contention.find,
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


In = TypeVar("In")


@dataclass(frozen=True)
class SecondPass(Generic[In, F]):
    """A pass that decides findings after the analysis: its name and its function over its one
    typed input."""

    name: str
    run: Callable[[In], Passed[F]]


# a multi-rank session's ranks compared: the DIST findings, ranked in by `finalize.with_more`
RANKS: SecondPass[RanksSeen, Finding] = SecondPass("ranks", rank_findings)
# `gpudiag merge`: the ranks compared across per-host reports, with each report's findings
MERGE: SecondPass[ReportsMerged, dict] = SecondPass("merge", merged_findings)
# a report's profiler capture: its evidence in the findings it confirms or refutes
CAPTURE: SecondPass[CaptureSeen, dict] = SecondPass("capture", capture_findings)

SECOND_PASSES: tuple[SecondPass, ...] = (RANKS, MERGE, CAPTURE)
