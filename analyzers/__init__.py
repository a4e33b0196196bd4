"""Analyzers: pure functions from a timeline and thresholds to a time breakdown and findings.

`analyze` and its types load on first use (PEP 562): importing one sub-package (the
catalogue, the prices) does not load the engine and every finding."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudiag.analyzers.engine.analysis import Analysis, analyze, unjudged, verdict_of

__all__ = ["Analysis", "analyze", "unjudged", "verdict_of"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpudiag.analyzers.engine import analysis

        return getattr(analysis, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
