"""The README's figures a newcomer feels, and the longest stretch without a heading on each
docs page: `python scripts/readme_stats.py` prints them; tests/docs/test_readme_style.py holds
them (about 150 lines, a median sentence of 25 words or fewer, a heading every 60 lines)."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# what a reader outside the project cannot use: the machine it was written on, issue numbers,
# dates (they belong in CHANGELOG.md)
BANNED = {
    "this box": re.compile(r"\bthis (?:\d+-core )?box\b", re.I),
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
}


def prose(text: str) -> str:
    """The README's running text: no code blocks, tables, headings or images."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    keep = [ln for ln in text.splitlines() if not ln.lstrip().startswith(("|", "#", "![", "<"))]
    return "\n".join(keep)


def sentences(text: str) -> list[str]:
    """Sentences of the running text: a paragraph or bullet ends one; so does '.', '!' or '?'
    before a space (but in "e.g." and "i.e.")."""
    out = []
    for block in re.split(r"\n\s*\n|\n(?=\s*[-*] )", prose(text)):
        block = " ".join(block.split()).lstrip("-* ").strip()
        out += [
            s for s in re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=[.!?])\s+(?=\S)", block) if s.strip()
        ]
    return out


def words(sentence: str) -> int:
    return len(sentence.split())


def longest_without_heading(text: str) -> int:
    """The most lines in a row with no heading (outside code blocks)."""
    longest = run = 0
    fenced = False
    for ln in text.splitlines():
        if ln.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,6} ", ln):
            run = 0
        else:
            run += 1
            longest = max(longest, run)
    return longest


def stats(text: str) -> dict[str, object]:
    """Lines, headings, sentences, the median and the longest sentence, the banned phrases."""
    lengths = [words(s) for s in sentences(text)]
    return {
        "lines": len(text.splitlines()),
        "headings": len(re.findall(r"^#{1,6} ", prose_with_headings(text), flags=re.M)),
        "sentences": len(lengths),
        "median_words": statistics.median(lengths) if lengths else 0,
        "longest_words": max(lengths, default=0),
        "banned": sorted(name for name, rx in BANNED.items() if rx.search(text)),
    }


def prose_with_headings(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def main() -> int:
    readme = (ROOT / "README.md").read_text()
    for key, value in stats(readme).items():
        print(f"README.md {key}: {value}")
    for page in sorted((ROOT / "docs").glob("*.md")):
        run = longest_without_heading(page.read_text())
        print(f"{page.relative_to(ROOT)}: at most {run} lines without a heading")
    return 0


if __name__ == "__main__":
    sys.exit(main())
