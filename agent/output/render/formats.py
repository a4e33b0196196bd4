"""The output formats, one map: every command that prints or writes a report document
(`report`, `replay`, `merge`, `run`, `attach`) renders it through here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from gpudiag.agent.base.safeio import dumps_json
from gpudiag.agent.output.render.text import render_markdown, render_text
from gpudiag.agent.output.report_types import Report


def as_report(doc: Mapping[str, Any]) -> Report:
    """A report document as its schema's type: one that `report.build` made or a reader
    validated against the schema (the renderers are checked against these types)."""
    return cast(Report, doc)


def _html(doc: dict, verbose: bool) -> str:
    from gpudiag.agent.output.render.html import render_html  # its charts load only here

    return render_html(as_report(doc))


# format -> the document's text (verbose: the full diagnosis; else the summary's shorter one)
FORMATS: dict[str, Callable[[dict, bool], str]] = {
    "text": lambda doc, verbose: render_text(as_report(doc), verbose=verbose) + "\n",
    "markdown": lambda doc, verbose: render_markdown(as_report(doc)),
    "json": lambda doc, verbose: dumps_json(doc, indent=2) + "\n",  # strict: never a NaN token
    "html": _html,
}


PAGES = ("html",)  # a whole page: a file or a report's own rendering, never a job's summary
SUMMARIES: tuple[str, ...] = tuple(name for name in FORMATS if name not in PAGES)
"""The formats `run`, `attach` and `merge` print their summary in (beside a job's output)."""


def render(doc: dict, fmt: str, verbose: bool = True) -> str:
    """The report document in one of FORMATS."""
    return FORMATS[fmt](doc, verbose)
