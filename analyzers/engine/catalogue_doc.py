"""Each finding's documentation, generated from its spec (what it means, the fix, how its
impact and speed-up are measured, the thresholds its unit reads), as ruff's rule pages are
generated from its rules: docs/findings.md holds them between two markers, and a test keeps
them current (`python scripts/findings_doc.py` rewrites them)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from dataclasses import fields
from functools import cache
from types import ModuleType

import gpudiag.analyzers.distributed
import gpudiag.analyzers.findings
from gpudiag.analyzers.model.catalogue import CATALOGUE, Spec
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.files import read_regular

BEGIN = "<!-- findings: generated from the specs by `python scripts/findings_doc.py` -->"
END = "<!-- findings: end of the generated part -->"
CATEGORIES = {
    "host": "On the host: the loop thread, its input pipeline, the box",
    "transfer": "Between host and GPU",
    "gpu": "On the GPU",
    "run": "The run as a whole",
    "distributed": "Across ranks",
    "cost": "Money",
}
SETTINGS = frozenset(f.name for f in fields(Thresholds))
SOURCE_LIMIT = 1 << 20  # a unit module is kilobytes


@cache
def catalogue() -> dict[str, Spec]:
    """Every finding's spec, each finding unit imported (so registered) first: the way to read
    the catalogue where no analysis has loaded the engine (`gpudiag mcp`, the metrics)."""
    for pkg in (gpudiag.analyzers.findings, gpudiag.analyzers.distributed):
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(info.name)
    return CATALOGUE


def owners() -> dict[str, ModuleType]:
    """Finding id -> the unit module that declares its spec (`ID = register(...)`)."""
    out: dict[str, ModuleType] = {}
    for pkg in (gpudiag.analyzers.findings, gpudiag.analyzers.distributed):
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            mod = importlib.import_module(info.name)
            src = _source(mod.__file__ or "")
            out |= {fid: mod for fid in re.findall(r"^([A-Z]+\d{3}) = register\(", src, re.M)}
    return out


def _source(path: str) -> str:
    """A gpudiag module's own source, through the bounded reader."""
    return read_regular(path, SOURCE_LIMIT).decode()


@cache
def settings_read(path: str) -> tuple[str, ...]:
    """The thresholds a module's source reads (`th.NAME`, `c.th.NAME`, a "NAME" setting)."""
    names = set()
    for node in ast.walk(ast.parse(_source(path))):
        if isinstance(node, ast.Attribute) and node.attr in SETTINGS:
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and node.value in SETTINGS:
            names.add(node.value)
    return tuple(sorted(names))


def spec_settings(s: Spec, module: ModuleType | None) -> tuple[str, ...]:
    """The thresholds a finding reads: its unit's source's, and its spec's own (the setting
    its error impact is named by, wherever the spec was written)."""
    read = set(settings_read(module.__file__ or "")) if module is not None else set()
    if s.error_setting in SETTINGS:
        read.add(s.error_setting)
    return tuple(sorted(read))


def _setting(name: str, th: Thresholds) -> str:
    return f"`{name}` ({getattr(th, name):g})"


def finding_doc(s: Spec, module: ModuleType | None = None) -> str:
    """One finding's section, in Markdown."""
    th = Thresholds()
    traits = [s.category]
    if s.explains_gpu_idle:
        traits.append("can explain GPU idle")
    if s.always_note:
        traits.append("always a note")
    elif s.error_setting:
        traits.append(f"an error from {_setting(s.error_setting, th)}")
    else:
        traits.append("a warning at most")
    lines = [f"### {s.id}: {s.title}", "", " · ".join(traits)]
    if module is not None:
        where = module.__name__.removeprefix("gpudiag.").replace(".", "/")
        lines[-1] += f" · `{where}.py`"
    if s.doc is not None:
        lines += ["", f"**What it means.** {_sentence(s.doc.means)}"]
        lines += ["", f"**The fix it suggests.** {_sentence(s.doc.fix)}"]
        for m in s.doc.measured:
            head = f"**Measured ({m.variant}).**" if m.variant else "**Measured.**"
            text = f"{head} Impact: {m.impact}. Speed-up: {m.speedup}."
            if m.checked:
                text += f" Checked on an H100 (predicted / measured): {m.checked}."
            lines += ["", text]
    if read := spec_settings(s, module):
        lines += ["", "**Thresholds its unit reads.** " + ", ".join(_setting(n, th) for n in read)]
    return "\n".join(lines) + "\n"


def _sentence(text: str) -> str:
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub and markdown-it's anchors plugin make it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _index(own_specs: dict[str, list[Spec]]) -> list[str]:
    """A table of the families, each with its findings linked to their sections."""
    rows = ["| family | findings |", "|---|---|"]
    for cat, specs in own_specs.items():
        heading = CATEGORIES[cat]
        links = " · ".join(f"[{s.id}](#{anchor(f'{s.id}: {s.title}')})" for s in specs)
        rows.append(f"| [{heading}](#{anchor(heading)}) | {links} |")
    return rows + [""]


def findings_section() -> str:
    """An index of the families, then every finding's section, grouped by category, between
    the page's markers."""
    own = owners()
    families = {
        cat: sorted((s for s in CATALOGUE.values() if s.category == cat), key=lambda s: s.id)
        for cat in CATEGORIES
    }
    families = {cat: specs for cat, specs in families.items() if specs}
    parts = [BEGIN, ""] + _index(families)
    for cat, specs in families.items():
        parts += [f"## {CATEGORIES[cat]}", ""]
        parts += [finding_doc(s, own.get(s.id)) for s in specs]
    parts.append(END)
    return "\n".join(parts) + "\n"


def with_section(page: str) -> str:
    """The page with its generated part replaced by the current one."""
    start, end = page.index(BEGIN), page.index(END) + len(END) + 1
    return page[:start] + findings_section() + page[end:]
