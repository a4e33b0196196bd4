"""The finding catalogue: one place for ids, titles, categories and severity rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudiag.analyzers.engine.catalogue_doc import catalogue
from gpudiag.analyzers.model.catalogue import about_time_in, new_finding, severity
from gpudiag.analyzers.model.results import Finding, Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds

CATALOGUE = catalogue()  # the finding units register their specs when the engine loads them

ANALYZERS = Path(__file__).resolve().parents[2] / "analyzers"


def finding(fid: str, impact: float = 0.5) -> Finding:
    return Finding(
        id=fid,
        title=CATALOGUE[fid].title,
        severity="warning",
        confidence=0.9,
        impact=impact,
        message="",
        evidence=(),
        recommendation=Recommendation("", ()),
        expected_speedup=1.0,
    )


def test_every_emitted_id_is_in_the_catalogue():
    emitted = set()
    for path in ANALYZERS.rglob("*.py"):
        emitted |= set(re.findall(r'new_finding\(\s*"([A-Z]+\d+)"', path.read_text()))
    assert len(emitted) >= 20 and emitted <= set(CATALOGUE)


def test_only_the_catalogue_builds_findings():
    """Every finding's id, title and severity come from its catalogue entry: no analyzer
    constructs a Finding itself."""
    builders = [
        path.name
        for path in ANALYZERS.rglob("*.py")
        if re.search(r"(?<![\w.])Finding\(", path.read_text())
    ]
    assert builders == ["catalogue.py"]


def test_the_spec_gives_title_severity_and_the_note_variant():
    th = Thresholds()
    rest = dict(
        confidence=0.9,
        message="m",
        evidence=(),
        recommendation=Recommendation("", ()),
        expected_speedup=1.0,
    )
    f = new_finding("THROT001", th, impact=0.5, detail="by thermal slowdown", **rest)
    assert f.title == "GPU clocks throttled by thermal slowdown" and f.severity == "error"
    note = new_finding("THROT001", th, impact=0.0, note=True, **rest)
    assert note.title.startswith("GPU at its power limit") and note.severity == "note"
    low = new_finding("CKPT001", th, impact=0.01, severity_at=0.9, **rest)
    assert low.severity == "error" and low.impact == 0.01


def test_gpu_finding_at_error_impact_is_an_error():
    th = Thresholds()
    assert severity("GPU001", 0.95, th) == "error"
    assert severity("GPU001", th.error_impact / 2, th) == "warning"
    assert severity("MEM001", 0.95, th) == "note"


def test_findings_are_built_by_keyword_only():
    with pytest.raises(TypeError):
        Finding("GPU001", "t", "warning", 0.9, 0.5, "", (), Recommendation("", ()), 1.0)


def test_findings_about_a_breakdown_category_whatever_their_id():
    assert about_time_in([finding("CKPT001")], "checkpoint")
    assert not about_time_in([finding("DATA001"), finding("GPU001")], "checkpoint")
