"""The second passes over a job's ranks (registered in `engine/registry.py`): the DIST findings
of a multi-rank session, and the findings of a job report merged from per-host reports."""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analyzers.distributed.compare import straggler
from gpudiag.analyzers.distributed.hang import DIST002  # noqa: F401  (the pass's hang: its spec registered)
from gpudiag.analyzers.distributed.ranks import RankStats
from gpudiag.analyzers.model.catalogue import compares_ranks, ranked
from gpudiag.analyzers.model.results import Finding, Passed
from gpudiag.analyzers.model.thresholds import Thresholds


@dataclass(frozen=True)
class RanksSeen:
    """The `ranks` pass's input: every rank's numbers, and the hang a session saw (DIST002)."""

    ranks: list[RankStats]
    th: Thresholds
    hang: Finding | None = None


@dataclass(frozen=True)
class ReportsMerged:
    """The `merge` pass's input: the ranks of every merged report, and each report's findings
    under its host's name (or its path)."""

    ranks: RanksSeen
    reports: list[tuple[str, list[dict]]]


def rank_findings(seen: RanksSeen) -> Passed[Finding]:
    """The ranks compared: the hang (when seen) and the straggler's findings; the part is the
    straggler decision in words."""
    found, decision = straggler(seen.ranks, seen.th)
    if seen.hang is not None:
        found = [seen.hang, *found]
    return Passed(found, decision)


def merged_findings(m: ReportsMerged) -> Passed[dict]:
    """A merged job report's findings, ranked: the ranks compared across every report, and each
    report's own findings but those decided again across the ranks (named by their host when
    the job ran on several)."""
    compared = rank_findings(m.ranks)
    several = len({str(r.host) for r in m.ranks.ranks}) > 1
    findings = [f.to_dict() for f in compared.findings]
    for host, found in m.reports:
        for f in found:
            if compares_ranks(f["id"]):
                continue  # decided again across every rank
            findings.append(dict(f, message=f"{host}: {f['message']}") if several else f)
    return Passed(ranked(findings), compared.part)
