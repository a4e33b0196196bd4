"""docs/findings.md's sections are generated from the finding specs and kept current."""

from __future__ import annotations

from pathlib import Path

from gpudiag.analyzers.engine.catalogue_doc import BEGIN, END, finding_doc, with_section
from gpudiag.analyzers.model.catalogue import CATALOGUE

PAGE = Path(__file__).resolve().parents[2] / "docs" / "findings.md"


def test_the_findings_page_is_generated_from_the_current_specs():
    page = PAGE.read_text()
    assert with_section(page) == page, "stale: run `python scripts/findings_doc.py`"


def test_every_finding_has_its_section_with_meaning_and_fix():
    part = PAGE.read_text().split(BEGIN)[1].split(END)[0]
    for fid, s in CATALOGUE.items():
        assert f"### {fid}: {s.title}" in part
        assert s.doc is not None and s.doc.means and s.doc.fix, fid


def test_a_section_names_the_thresholds_its_unit_reads():
    from gpudiag.analyzers.findings import sync

    text = finding_doc(CATALOGUE["SYNC001"], sync)
    assert "`sync_warn` (" in text and "analyzers/findings/sync.py" in text


def test_the_index_links_every_family_and_finding_to_its_heading():
    import re

    from gpudiag.analyzers.engine.catalogue_doc import anchor

    page = PAGE.read_text()
    heads = {anchor(h) for h in re.findall(r"^#{2,3} (.+)$", page, flags=re.M)}
    links = set(re.findall(r"\]\(#([^)]+)\)", page.split(BEGIN)[1].split(END)[0]))
    assert {anchor(f"{fid}: {s.title}") for fid, s in CATALOGUE.items()} <= links
    assert links <= heads, sorted(links - heads)
    assert anchor("GPU003: Matrix work (fp32 without TF32/AMP)") == (
        "gpu003-matrix-work-fp32-without-tf32amp"
    )
