"""Analyzers: pure functions from a timeline and thresholds to a time breakdown and findings."""

from gpudiag.analyzers.engine.analysis import Analysis, analyze, unjudged, verdict_of

__all__ = ["Analysis", "analyze", "unjudged", "verdict_of"]
