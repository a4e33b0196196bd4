"""What a finished session collected: the one type the report is written from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import ProbeStatus

if TYPE_CHECKING:
    from gpudiag.analyzers import Analysis


@dataclass
class SessionResult:
    """What a finished session collected."""

    analysis: Analysis
    probes: list[ProbeStatus]
    errors: list[dict]
    start: float
    end: float
    end_reason: str
    exit_code: int | None
    timeline: Timeline = field(repr=False, default_factory=Timeline)
    hardware: dict = field(default_factory=dict)
    agent: dict | None = None  # the agent's own cost and its effective sampling rates
    distributed: dict | None = None  # a multi-rank job: the report's `ranks`, `distributed`
