"""Text laid out at the width the terminal gives, never breaking a number from its unit.

Rich wraps at any space, so "17.34 steps/s" can end up on two lines, and folds a long name
anywhere (`__next__` cut in two). These renderables break lines themselves: never right
after a number, long paths and dotted names only after `/`, `.` or `:`, and panel values
only between items.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from gpudiag.text.redact import printable

NUMBER = re.compile(r"^[-+×~≈$(]*\d[\d.,:]*$")  # a bare number: its unit follows it
BREAK_AFTER = re.compile(r"(?<=[/.:])(?=[^/.:])")  # where a long name may break


def atoms(text: str) -> list[str]:
    """Words of `text`, each number glued to the word after it."""
    out: list[str] = []
    glue = False
    for word in text.split(" "):
        if glue and out:
            out[-1] += " " + word
        else:
            out.append(word)
        glue = bool(NUMBER.match(word))
    return [a for a in out if a]


def _pieces(atom: str, width: int) -> list[str]:
    """An atom too long for a line, cut after path and name separators (else hard)."""
    parts = [p for p in BREAK_AFTER.split(atom) if p]
    lines = [""]
    for p in parts:
        if lines[-1] and len(lines[-1]) + len(p) > width:
            lines.append("")
        lines[-1] += p
    out = []
    for ln in lines:
        out += [ln[i : i + width] for i in range(0, len(ln), width)] or [""]
    return out


def pack(items: list[str], width: int, sep: str = " ") -> list[str]:
    """Items greedily on lines of `width` cells, broken only between items."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + len(sep) + len(item) <= width:
            lines[-1] += sep + item
        elif len(item) <= width:
            lines.append(item)
        else:
            lines += _pieces(item, max(1, width))
    return lines or [""]


@dataclass
class Block:
    """One paragraph or panel row: a bold label (or lead) and wrapped content after it."""

    content: list[str]
    label: str = ""
    label_width: int = 0
    sep: str = " "
    style: str = ""
    label_style: str = "bold"


@dataclass
class Wrapped:
    """A stack of blocks, each wrapped at render time to the width available."""

    blocks: list[Block] = field(default_factory=list)

    def para(
        self, text: str, style: str = "", lead: str = "", indent: int = 0, lead_style: str = "bold"
    ) -> Wrapped:
        """Prose: numbers stay with their units; a lead ("Fix: ", "  • ") hangs before it.
        Control characters and escapes are dropped (a field may hold the job's text)."""
        for line in printable(text, lines=True).split("\n"):
            self.blocks.append(
                Block(atoms(line), lead, max(indent, len(lead)), " ", style, lead_style)
            )
            lead = ""
        return self

    def row(self, label: str, items: list[str], label_width: int = 18) -> Wrapped:
        """A panel row: label, then items separated by " · ", broken only between items."""
        items = [printable(i) for i in items]
        self.blocks.append(Block(items, printable(label), label_width, " · "))
        return self

    def blank(self) -> Wrapped:
        self.blocks.append(Block([]))
        return self

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for b in self.blocks:
            label, indent = b.label, b.label_width
            if (
                label.strip()
                and b.sep != " "
                and max(map(len, b.content), default=0) > width - indent
            ):
                # a value wider than the room beside its label goes under it
                yield Text(label, style=b.label_style, no_wrap=True, overflow="ellipsis")
                label, indent = "", min(2, indent)
            for i, line in enumerate(pack(b.content, max(8, width - indent), b.sep)):
                t = Text(no_wrap=True, overflow="ellipsis")
                t.append((label if i == 0 else "").ljust(indent), style=b.label_style)
                t.append(line, style=b.style)
                yield t

    def plain(self, width: int) -> str:
        """The text as laid out at `width` (for tests and logs)."""
        console = Console(width=width, color_system=None, file=None)
        with console.capture() as cap:
            console.print(self)
        return cap.get()
