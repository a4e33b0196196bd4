"""What `gpudiag gate` shows: the comparison table, one-line descriptions, GitHub Actions
annotations and step summary, and JUnit XML."""

from __future__ import annotations

import math
import os
import sys
from xml.sax.saxutils import escape

from gpudiag.agent.base.safeio import WriteError, append_text, atomic_write
from gpudiag.analyzers.stats.gate import Comparison
from gpudiag.text.redact import printable
from gpudiag.text.sink import emit, line, outbound


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4g}"


def _pct(v: float | None, relative: bool = True) -> str:
    if v is None:
        return "n/a"
    return f"{v:+.1%}" if relative else f"{v:.4g}"


HEADINGS = ("metric", "verdict", "baseline", "current", "delta", "95% interval", "n (b/c)", "limit")


def _excess(c: Comparison) -> float:
    """How large a change is: |log ratio| (a halving and a doubling weigh the same), or the
    distance past an absolute budget as a share of it."""
    if c.baseline is not None:
        return math.inf if (c.delta or 0.0) <= -1 else abs(math.log1p(c.delta or 0.0))
    if c.current is None or not c.limit:
        return 0.0
    return abs(c.current - c.limit) / abs(c.limit)


def worst_first(comps: list[Comparison]) -> list[Comparison]:
    """Failures, then inconclusive, warnings, passes; the largest change first in each."""
    order = ["fail", "inconclusive", "warn", "pass"]
    return sorted(comps, key=lambda c: (order.index(c.verdict), -_excess(c)))


def _cells(c: Comparison) -> tuple[str, ...]:
    """One metric's row, as the terminal and the step summary show it."""
    rel = c.baseline is not None
    return (
        c.metric,
        c.verdict.upper(),
        _fmt(c.baseline),
        _fmt(c.current),
        _pct(c.delta, rel) if rel else "budget",
        f"[{_pct(c.ci_low, rel)}, {_pct(c.ci_high, rel)}]",
        f"{c.n_baseline}/{c.n_current}",
        (f"{c.limit:.0%}" if rel else _fmt(c.limit)) if c.limit is not None else "-",
    )


def table(comps: list[Comparison]) -> list[str]:
    """The readable table: baseline, current, delta, interval and n per metric."""
    rows = [HEADINGS] + [_cells(c) for c in worst_first(comps)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def describe(c: Comparison) -> str:
    """One line naming the metric, the delta and the interval."""
    if c.baseline is None:
        return (
            f"{c.metric}: {_fmt(c.current)} against budget {_fmt(c.limit)} "
            f"(95% interval of the median {_fmt(c.ci_low)}..{_fmt(c.ci_high)}, "
            f"n={c.n_current}) — {c.reason}"
        )
    return (
        f"{c.metric}: {_fmt(c.baseline)} -> {_fmt(c.current)} ({_pct(c.delta)}, 95% "
        f"interval {_pct(c.ci_low)}..{_pct(c.ci_high)}, n={c.n_baseline}/{c.n_current}, "
        f"fail limit {c.limit:.0%}) — {c.reason}"
        if c.limit is not None
        else f"{c.metric}: {_pct(c.delta)} — {c.reason}"
    )


def github_outputs(verdict: str, comps: list[Comparison], note: str) -> None:
    """::error/::warning annotations (worst first) and a step-summary table."""
    if not os.environ.get("GITHUB_ACTIONS"):
        return
    for c in worst_first(comps):
        if c.verdict == "fail":
            emit(line(f"::error title=gpudiag gate: {c.metric} regressed::{describe(c)}"))
        elif c.verdict in ("warn", "inconclusive"):
            emit(line(f"::warning title=gpudiag gate: {c.metric} {c.verdict}::{describe(c)}"))
    if note:
        emit(line(f"::warning title=gpudiag gate::{note}"))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        lines = [f"### gpudiag gate: {verdict.upper()}", ""]
        if note:
            lines += [note, ""]
        if comps:
            lines += ["| " + " | ".join(HEADINGS) + " |", "|" + "---|" * len(HEADINGS)]
            lines += ["| " + " | ".join(_cells(c)) + " |" for c in worst_first(comps)]
        try:
            append_text(summary, outbound("\n".join(lines)) + "\n", what="GitHub step summary")
        except WriteError as exc:  # a FIFO or a link: said, and the gate's verdict stands
            emit(f"gpudiag: {exc}", file=sys.stderr)


def _attr(text: str) -> str:
    """Text for an XML attribute value: control characters removed (XML 1.0 refuses
    them), `&<>"'` escaped."""
    return escape(printable(str(text)), {'"': "&quot;", "'": "&apos;"})


def junit_xml(path: str, comps: list[Comparison], note: str) -> None:
    """One test case per metric; failures for regressions, skipped for inconclusive."""
    cases = []
    for c in comps:
        body = ""
        if c.verdict == "fail":
            body = f'<failure message="{_attr(describe(c))}"/>'
        elif c.verdict == "inconclusive":
            body = f'<skipped message="{_attr(describe(c))}"/>'
        cases.append(
            f'  <testcase classname="gpudiag.gate" name="{_attr(c.metric)}">{body}</testcase>'
        )
    fails = sum(c.verdict == "fail" for c in comps)
    skipped = sum(c.verdict == "inconclusive" for c in comps)
    xml = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuite name="gpudiag gate" tests="{len(comps)}" failures="{fails}" '
        f'skipped="{skipped}">',
    ]
    if note:
        xml.append(f'  <properties><property name="note" value="{_attr(note)}"/></properties>')
    xml += cases + ["</testsuite>"]
    atomic_write(path, "\n".join(xml) + "\n", what="JUnit XML")


def print_result(verdict: str, comps: list[Comparison], note: str) -> None:
    """The table and the verdict line on stdout."""
    if comps:
        emit("\n".join(table(comps)))
    if note:
        emit(note)
    worst = [c for c in worst_first(comps) if c.verdict in ("fail", "inconclusive")]
    for c in worst:
        emit(("REGRESSION " if c.verdict == "fail" else "INCONCLUSIVE ") + describe(c))
    emit(f"gpudiag gate: {verdict.upper()}")
    sys.stdout.flush()
