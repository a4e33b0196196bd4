"""The finding catalogue: every finding id, its title, category, whether it can explain GPU
idle time, how its severity follows from its impact, what it claims of the loop and what it
reads, and its documentation. Each finding unit (a module of analyzers/findings, and the
distributed and cost passes) declares its own specs with `register`; the catalogue is their
union, complete once `gpudiag.analyzers` is imported (its roof imports every unit). Analyzers
ask this module; they never match each other's id strings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpudiag.analyzers.model.results import Finding, Severity
from gpudiag.analyzers.model.thresholds import Thresholds


@dataclass(frozen=True)
class Measured:
    """How a finding's impact and speed-up are computed (one row per variant of its fix), and
    the check on a real GPU (predicted / measured) where one was made."""

    impact: str
    speedup: str
    variant: str = ""
    checked: str = ""


@dataclass(frozen=True)
class Doc:
    """A finding's documentation: what it means, the fix it suggests, how it is measured.
    docs/findings.md is generated from these (scripts/findings_doc.py)."""

    means: str
    fix: str
    measured: tuple[Measured, ...] = ()


@dataclass(frozen=True)
class Spec:
    """One catalogue entry."""

    id: str
    title: str
    category: str  # host, gpu, transfer, distributed, cost, run
    explains_gpu_idle: bool  # a cause on the critical path: the GPU idles because of it
    error_setting: str | None = "error_impact"  # threshold naming the error impact; None: never
    always_note: bool = False  # informational: never a warning
    time_in: str | None = None  # the Breakdown category whose time the finding is about
    compares_ranks: bool = False  # decided by comparing every rank (merge decides it again)
    note_title: str | None = None  # the title of an informational finding of this id
    # precedence, declared: the parts of the loop a finding of this id takes for itself
    # (another finder reads them with `Context.claimed`), and the claims its finder reads
    # (so it runs after every finder whose specs claim them; "*": after every other finder)
    claims: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    about_money: bool = False  # the money view of the other findings, not a cause of its own
    # what settles a finding the stacks alone cannot make sure, whatever the look's length
    settled_by_hooks: str | None = None
    own_check: str | None = None  # judged on its own signal once this check is (not stacks)
    doc: Doc | None = None

    @property
    def claimed(self) -> frozenset[str]:
        """What a finding of this id claims, "gpu_idle" included when it explains GPU idle."""
        return frozenset(self.claims) | ({"gpu_idle"} if self.explains_gpu_idle else set())

    def finding(
        self,
        th: Thresholds,
        *,
        impact: float,
        severity_at: float | None = None,
        note: bool = False,
        detail: str = "",
        **fields: Any,
    ) -> Finding:
        """A Finding of this id: its title from here (`detail` appended; `note_title` for a
        note) and its severity from its impact (or `severity_at`), `note` forcing a note;
        the rest (confidence, message, evidence, fix, speed-up and its basis...) as given."""
        title = (self.note_title if note and self.note_title else self.title) + (
            f" {detail}" if detail else ""
        )
        at = impact if severity_at is None else severity_at
        level: Severity = "note" if note else severity(self.id, at, th)
        return Finding(
            id=self.id, title=title, severity=level, impact=impact, **capped_bound(fields, th)
        )


def capped_bound(fields: dict, th: Thresholds) -> dict:
    """A bound ("at most") above `bound_max` held at it, its basis saying so: past it the
    share left after the fix is a few percent of the loop, under what the stack samples place
    reliably, and the figure (x100 from a share of 99.99%) says nothing the evidence holds."""
    speed = fields.get("expected_speedup")
    if fields.get("speedup_kind") != "bound" or speed is None or speed <= th.bound_max:
        return fields
    basis = fields.get("speedup_basis", "")
    held = f"held at x{th.bound_max:g} (bound_max): x{speed:.0f} rests on the few percent left"
    return {**fields, "expected_speedup": th.bound_max, "speedup_basis": f"{basis}; {held}"}


CATALOGUE: dict[str, Spec] = {}  # filled by the finding units' `register`


def register(s: Spec) -> Spec:
    """Enter one of a unit's specs in the catalogue (an id registered twice is a bug)."""
    if CATALOGUE.setdefault(s.id, s) is not s:
        raise ValueError(f"finding id {s.id} registered twice")
    return s


def spec(finding_id: str) -> Spec:
    """The catalogue entry of an id (KeyError for an unknown id: register it in its unit)."""
    return CATALOGUE[finding_id]


def new_finding(finding_id: str, th: Thresholds, **fields: Any) -> Finding:
    """A Finding of `finding_id`, built by its catalogue entry (see `Spec.finding`)."""
    return spec(finding_id).finding(th, **fields)


def severity(finding_id: str, impact: float, th: Thresholds) -> Severity:
    """error, warning or note for a finding of this id at this impact."""
    s = spec(finding_id)
    if s.always_note:
        return "note"
    if s.error_setting is not None and impact >= getattr(th, s.error_setting):
        return "error"
    return "warning"


def explains_gpu_idle(finding_id: str) -> bool:
    """Whether a finding of this id is a cause of GPU idle time (on the critical path)."""
    return spec(finding_id).explains_gpu_idle


def about_time_in(findings: list, breakdown_category: str) -> bool:
    """Whether any of `findings` is about time spent in this Breakdown category (e.g. any
    finding about checkpoint saves), whatever its id."""
    return any(spec(f.id).time_in == breakdown_category for f in findings)


def about_money(finding_id: str) -> bool:
    """Whether a finding of this id is the money view of the others (never a fix to rank)."""
    return spec(finding_id).about_money


def compares_ranks(finding_id: str) -> bool:
    """Whether a finding of this id is decided by comparing the ranks (a straggler, every rank
    communication-bound): a merge of per-host reports decides it again over all the ranks."""
    return spec(finding_id).compares_ranks


def category(finding_id: str) -> str:
    """host, gpu, transfer, distributed, cost or run."""
    return spec(finding_id).category


def _get(f: Any, key: str) -> Any:
    return f[key] if isinstance(f, dict) else getattr(f, key)


def ranked(findings: list) -> list:
    """Findings (objects or report dicts) largest impact first (ties by id): the one ranking
    `analyze`, the multi-rank session and `merge` share; a hypothesis after the rest. A cause
    in the box (HOST002) ranks by its impact like any other: beside a process burning one of
    2 cores, the held-out jobs' planted fixes moved them x0.8-0.92 while giving the intra-op
    pool the core the other process left moved them x1.5-2.8 (docs/how-it-measures.md, 'A busy
    box')."""
    return sorted(findings, key=lambda f: (*_unverified(f), -_get(f, "impact"), _get(f, "id")))


def _unverified(f: Any) -> tuple[int, float]:
    """Causes whose speed-up is measured, modelled or bounded first; then the causes whose
    speed-up is an unchecked hypothesis (a cause seen whose fix may not help, as batching on a
    CPU did not, never outranks one that will), among them by the share their low end surely
    gives back; then the notes (a cause under its warning threshold); last, what costs no
    time (money, memory headroom: impact 0), which never leads a verdict over a cause (a Flask
    server's verdict was COST001)."""
    kind = f.get("speedup_kind") if isinstance(f, dict) else getattr(f, "speedup_kind", None)
    sev = f.get("severity") if isinstance(f, dict) else getattr(f, "severity", None)
    if sev == "note":  # under its threshold: after every warning
        return (2 if _get(f, "impact") > 0 else 3), 0.0
    if kind != "hypothesis":
        return (0 if _get(f, "impact") > 0 else 3), 0.0
    low = (f.get("speedup_low") if isinstance(f, dict) else getattr(f, "speedup_low", None)) or 1
    return 1, -(1.0 - 1.0 / max(1.0, low))
