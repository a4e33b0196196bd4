"""How a finding reads in the text and markdown summaries: its lines wrapped, the job's paths
shortened, the speed-up's basis in plain words, and its evidence split into what crossed a
threshold and what was only checked. The report's JSON is untouched: this is wording."""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# the width of a summary (a terminal or a file); the finding's lines wrap at it
WIDTH = 100

_COMPARISON = re.compile(r"\((?:>=|<=|>|<|==|vs) \S")
_PATH = re.compile(r"(?<![\w./-])(/(?:[\w.+-]+/)+[\w.+-]+\.py)\b")

# settings that are upper limits or floors: a value below them is the finding's side of them
_UPPER_SUFFIXES = ("_max", "_target")
_FLOOR_PREFIXES = ("min_",)


def crossed(e: Mapping[str, Any]) -> bool:
    """Whether an evidence item crossed its threshold on the finding's side: a reading with
    no threshold is evidence as it stands; '>=' a level is crossed; '<' a level is crossed only
    for an upper limit (`*_max`, `*_target`) or a floor (`min_*`) the value is under."""
    if e.get("threshold") is None:
        return True
    comparison, setting = e.get("comparison") or "", e.get("setting") or ""
    if comparison in (">=", ">"):
        return True
    if comparison in ("<", "<="):
        upper = setting.endswith(_UPPER_SUFFIXES) or setting.startswith(_FLOOR_PREFIXES)
        value, threshold = e.get("value"), e["threshold"]
        holds = value is not None and (
            value < threshold or (comparison == "<=" and value == threshold)
        )
        return upper and holds
    return True


def split_evidence(
    evidence: Iterable[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The evidence a finding rests on, and the checks that stayed on the other side of their
    threshold (context: the alternatives looked at and ruled out)."""
    rests: list[Mapping[str, Any]] = []
    context: list[Mapping[str, Any]] = []
    for e in evidence:
        (rests if crossed(e) else context).append(e)
    return rests, context


def job_dir(doc: Mapping[str, Any]) -> str | None:
    """The job's folder as the report shows it: its script's (the first absolute `.py` in the
    command), else the folder all the findings' absolute paths share (at least two deep)."""
    for arg in doc.get("run", {}).get("command") or []:
        if isinstance(arg, str) and arg.endswith(".py") and os.path.isabs(arg):
            return os.path.dirname(arg)
    paths = {
        p
        for f in doc.get("findings", [])
        for text in (f.get("message") or "", *f.get("recommendation", {}).get("actions", []))
        for p in _PATH.findall(text)
    }
    if not paths:
        return None
    common = os.path.commonpath([os.path.dirname(p) for p in paths])
    return common if common.count("/") >= 2 else None


def shorten_paths(text: str, root: str | None) -> str:
    """`text` with the absolute paths under `root` made relative to it."""
    if not root:
        return text
    prefix = root.rstrip("/") + "/"
    return _PATH.sub(lambda m: m[1][len(prefix) :] if m[1].startswith(prefix) else m[1], text)


_LOADER_BASIS = re.compile(
    r"loader rate with (?P<n>\d+) workers on at most (?P<k>\d+) of (?P<cores>\d+) physical cores"
    r"(?P<assumed> \(assumed[^)]*\))? against the rate the rest of the step allows "
    r"\((?P<share>\d+%) of it\)"
)


def plain_basis(basis: str) -> str:
    """The speed-up's basis in plain words (the DataLoader's model, the one written as a
    formula); any other basis reads as the analyzer wrote it."""

    def loader(m: re.Match[str]) -> str:
        n, k = int(m["n"]), int(m["k"])
        cores = f"{m['cores']} physical cores{m['assumed'] or ''}"
        workers = f"{n} loader worker{'s' if n != 1 else ''}"
        return (
            f"{workers} on {k} of {cores}; today loading keeps up with {m['share']} of the rate "
            "the rest of the step allows"
        )

    return _LOADER_BASIS.sub(loader, basis)


def wrapped(text: str, indent: str, hang: str | None = None, width: int = WIDTH) -> list[str]:
    """`text` as lines of at most `width` (a path or word longer than a line stays whole, and
    a comparison with its setting, "(>= data_wait_warn", on one line)."""
    glued = _COMPARISON.sub(lambda m: m[0].replace(" ", "\0"), text)
    lines = textwrap.wrap(
        glued,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent if hang is None else hang,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent.rstrip()]
    return [ln.replace("\0", " ") for ln in lines]


def bullets(items: Sequence[str], indent: str, mark: str) -> list[str]:
    """Each item as a wrapped bullet, its later lines under its text."""
    out: list[str] = []
    for item in items:
        out += wrapped(item, f"{indent}{mark} ", indent + " " * (len(mark) + 1))
    return out
