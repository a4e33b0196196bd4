"""What analyzers return: where the wall time went (Breakdown) and what to change (Finding)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Generic, Literal, TypeVar

CATEGORIES = (
    "data_wait",
    "storage_io",
    "h2d_copy",
    "forward",
    "backward",
    "optimizer",
    "sync",
    "checkpoint",
    "collective",
    "gil_wait",
    "other",
)

Severity = Literal["error", "warning", "note"]


@dataclass(frozen=True)
class Breakdown:
    """Shares of the training loop's wall time per category; they sum to 1.

    `basis` says what the shares rest on (e.g. "py-spy stack samples of thread 1234"),
    `samples` how many samples, and `thread` which thread drives the loop.
    """

    shares: dict[str, float]
    basis: str
    samples: int
    thread: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.shares) - set(CATEGORIES)
        if unknown:
            raise ValueError(f"unknown breakdown categories: {sorted(unknown)}")

    def get(self, category: str) -> float:
        """Share of one category (0 when absent)."""
        return self.shares.get(category, 0.0)

    def to_dict(self) -> dict:
        """JSON form: every category present, in the documented order."""
        return {
            "shares": {c: round(self.shares.get(c, 0.0), 6) for c in CATEGORIES},
            "basis": self.basis,
            "samples": self.samples,
            "thread": self.thread,
        }

    @staticmethod
    def empty(basis: str) -> Breakdown:
        """A breakdown with no data: all time is 'other'."""
        return Breakdown({"other": 1.0}, basis, 0, None)


@dataclass(frozen=True)
class Evidence:
    """One measured fact behind a finding, and the threshold it crossed (when it is a test)."""

    metric: str
    value: float | None
    unit: str
    threshold: float | None = None
    comparison: str | None = None  # ">=", "<", ... how value relates to threshold
    setting: str | None = None  # the threshold's name a user can override
    source: str | None = None  # which signal: stacks, procfs, psi, nvml...


@dataclass(frozen=True)
class Recommendation:
    """What to change: a one-line summary and concrete actions with values."""

    summary: str
    actions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Location:
    """Where in the user's code: file, line, function."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.function}"


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One diagnosed cause of lost time, with its evidence, fix and expected gain.

    Built by keyword only: id, title and severity come from analyzers.catalogue."""

    id: str
    title: str
    severity: Severity
    confidence: float
    impact: float
    message: str
    evidence: tuple[Evidence, ...]
    recommendation: Recommendation
    expected_speedup: float
    location: Location | None = None
    cost: dict | None = None
    signals: tuple[str, ...] = field(default=())
    speedup_basis: str = ""  # one line: how expected_speedup was made (model, bound)
    fix: dict | None = None  # {"kind": ..., "values": {...}}: applicable from outside (try)
    speedup_kind: str = "model"  # "model": what the named fix should give; "floor": at least;
    # "bound": at most;
    # "hypothesis": a range (speedup_low to expected_speedup) no measurement of the job has
    # checked yet (`gpudiag try` measures it)
    speedup_low: float | None = None

    def to_dict(self) -> dict:
        """JSON form used in reports."""
        d = asdict(self)
        d["evidence"] = [asdict(e) for e in self.evidence]
        d["recommendation"] = {
            "summary": self.recommendation.summary,
            "actions": list(self.recommendation.actions),
        }
        d["location"] = str(self.location) if self.location else None
        d["signals"] = list(self.signals)
        d["confidence"] = round(self.confidence, 3)
        d["impact"] = round(self.impact, 4)
        d["expected_speedup"] = round(self.expected_speedup, 3)
        if self.speedup_low is None:  # only a hypothesis has a low end
            del d["speedup_low"]
        else:
            d["speedup_low"] = round(self.speedup_low, 3)
        return d


def speedup_from_step(after: float) -> float:
    """The speed-up when a step takes `after` of its time now (the one formula every finding
    uses: at most x100, where a model's step would shrink to nothing)."""
    return 1.0 / max(0.01, after)


def speedup_from_impact(impact: float) -> float:
    """The speed-up if a cost of `impact` (share of wall time) went away entirely."""
    return speedup_from_step(1.0 - impact)


F = TypeVar("F", Finding, dict)


@dataclass(frozen=True)
class Passed(Generic[F]):
    """What a second pass decides (`engine/registry.py`'s `SECOND_PASSES`): its findings
    (objects, or report dicts for a pass over report documents) and its own part of the report
    (the straggler decision, the capture with its checks)."""

    findings: list[F]
    part: dict
