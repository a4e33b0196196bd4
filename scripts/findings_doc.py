"""Rewrite docs/findings.md's generated part from the finding specs (run after changing a
spec; tests/docs/test_findings_doc.py fails while the page is stale)."""

from __future__ import annotations

import sys
from pathlib import Path

from gpudiag.analyzers.engine.catalogue_doc import with_section

PAGE = Path(__file__).resolve().parent.parent / "docs" / "findings.md"


def main() -> int:
    """Write the page; 0 when it was current, 1 when it changed."""
    old = PAGE.read_text()
    new = with_section(old)
    if new == old:
        print(f"{PAGE.name}: current")
        return 0
    PAGE.write_text(new)
    print(f"{PAGE.name}: rewritten from the specs")
    return 1


if __name__ == "__main__":
    sys.exit(main())
