"""The registry of finders. A finder is a finding unit's `find(ctx) -> list[Finding]` over
the one analysis context (`context/context.py`, built once per analysed span), declared with
the specs of the findings it makes (`context/finder.py`). The order they run in follows from
those specs: a finder runs after every finder whose findings claim a part of the loop it
reads (`Spec.claims`, `Spec.reads`), so a finder defers to another through `Context.claimed`,
never by its id. `analyze` runs them all, then `finalize` ranks them, prices them and gives
the verdict. A new finding goes in its unit's module (see CONTRIBUTING.md); a new unit is a
module of analyzers/findings/ with a FINDER, found there (`UNITS`).

The findings decided after the analysis, over more than one context, come from the second
passes registered here too (`SECOND_PASSES`): each a function over its one typed input that
returns `Passed` (its findings and its part of the report). A session ranks a pass's findings
in with `finalize.with_more`; a pass over report documents returns them ranked."""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import import_module
from types import ModuleType
from typing import Generic, TypeVar

import gpudiag.analyzers.findings as findings
from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder, in_order
from gpudiag.analyzers.distributed.passes import (
    RanksSeen,
    ReportsMerged,
    merged_findings,
    rank_findings,
)
from gpudiag.analyzers.measures.capture import CaptureSeen, capture_findings
from gpudiag.analyzers.model.results import F, Finding, Passed


def _units() -> tuple[ModuleType, ...]:
    """The finding units: every module of the findings package that declares a FINDER, by
    name (a module without one is a part another unit imports)."""
    names = sorted(m.name for m in pkgutil.iter_modules(findings.__path__))
    modules = (import_module(f"{findings.__name__}.{name}") for name in names)
    return tuple(m for m in modules if hasattr(m, "FINDER"))


UNITS = _units()
FINDERS: tuple[Finder, ...] = in_order(unit.FINDER for unit in UNITS)


def run_finders(c: Context, finders: tuple[Finder, ...] = FINDERS) -> list[Finding]:
    """Every finder's findings over one context, in registration order."""
    found: list[Finding] = []
    for finder in finders:
        found += finder.find(replace(c, found=tuple(found)))
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
