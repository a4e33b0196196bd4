"""The README stays short and plain (scripts/readme_stats.py measures it), and every docs page
has a heading at least every 60 lines."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_RUN_WITHOUT_HEADING = 60


def stats_module():
    spec = importlib.util.spec_from_file_location(
        "readme_stats", ROOT / "scripts" / "readme_stats.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_is_about_150_lines_of_short_sentences():
    s = stats_module().stats((ROOT / "README.md").read_text())
    assert 100 <= s["lines"] <= 180, s
    assert s["median_words"] <= 25, s
    assert s["banned"] == [], s


def test_the_measure_counts_sentences_as_a_reader_does():
    m = stats_module()
    text = (
        "# Title\n\nOne two three. Four five six seven, e.g. eight nine.\n\n"
        "```\nnot. counted. here.\n```\n\n| a. | b. |\n\n- a bullet of five words\n"
        "- another one. And this.\n"
    )
    assert [m.words(s) for s in m.sentences(text)] == [3, 7, 5, 2, 2]
    assert m.stats("run on this 2-core box in issue 34 on 2026-11-25")["banned"] == [
        "a date",
        "an issue number",
        "this box",
    ]
    assert m.longest_without_heading("# a\nx\ny\n## b\nz\n") == 2


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_every_docs_page_has_a_heading_every_60_lines(page):
    text = (ROOT / "docs" / page).read_text()
    assert stats_module().longest_without_heading(text) <= MAX_RUN_WITHOUT_HEADING


def test_links_between_the_pages_resolve_to_a_file_and_a_heading():
    """Every relative link in the README and docs/ names a file that exists and, with an
    anchor, a heading of that file (the anchors GitHub makes)."""
    import re

    from gpudiag.analyzers.engine.catalogue_doc import anchor

    def heads(path: Path) -> set[str]:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        return {anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}

    bad = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target, frag in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text()):
            if target.startswith(("http:", "https:", "mailto:")):
                continue
            dest = (page.parent / target).resolve() if target else page
            if not dest.exists():
                bad.append(f"{page.name}: {target}")
            elif frag and dest.suffix == ".md" and frag not in heads(dest):
                bad.append(f"{page.name}: {target}#{frag}")
    assert not bad, bad
