"""The README renders as intended and its quick start works as written."""

from __future__ import annotations

import re
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]

README = ROOT / "README.md"

FINDINGS = ROOT / "docs" / "findings.md"


def test_findings_page_renders_every_finding_as_a_section():
    text = FINDINGS.read_text()
    ids = re.findall(r"^### ([A-Z]+\d{3}): ", text, flags=re.M)
    assert {"DATA001", "CKPT001", "GPU001", "COST001"} <= set(ids)
    html = MarkdownIt("gfm-like").render(text)
    heads = set(re.findall(r"<h3>([A-Z]+\d{3}): ", html))
    assert set(ids) == heads  # every section renders as its heading


def test_readme_links_to_docs_that_exist():
    """The short README points at the reference in docs/: every link resolves, every page is
    linked."""
    links = set(re.findall(r"\]\((docs/[^)#]+)", README.read_text()))
    assert links, "the README links no reference page"
    for link in links:
        assert (ROOT / link).is_file(), link
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= links, sorted(pages - links)


def quick_start_command() -> str:
    """The quick start's first block as run in a copy of the repository here: the copy is the
    clone, and this machine's pip configuration already serves torch's CPU build (no
    PyTorch index to reach)."""
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)\n```", section, flags=re.S)[0].strip()
    lines = [ln for ln in block.splitlines() if not ln.startswith("git clone")]
    cmd = "\n".join(lines).replace(" --index-url https://download.pytorch.org/whl/cpu", "")
    return "set -e\n" + cmd.replace("pip install torch ", "pip install torch==2.13.0 ")


def test_quick_start_installs_from_the_repository_with_torchs_cpu_index():
    """gpudiag is not on PyPI: the quick start installs it from the repository, and takes
    torch's CPU build from PyTorch's CPU index (PyPI's Linux torch is the CUDA build)."""
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "pip install gpudiag" not in section
    assert "git clone" in section and "pip install -e '.[demo]'" in section
    assert "--index-url https://download.pytorch.org/whl/cpu" in section
    assert "pip wheel" in section and "dist/gpudiag-" in section
    assert "gpudiag demo" in quick_start_command()
