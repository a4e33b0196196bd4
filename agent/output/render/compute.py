"""The report's compute_stacks (where a training loop's model time goes by module call site,
estimated from the loop thread's stack samples when no hook timed the modules) as lines and
a table."""

from __future__ import annotations

from collections.abc import Callable

from gpudiag.agent.output.report_types import Report

MAX_SHOWN = 8  # rows shown, largest first (the report holds up to 30)
TIME_WORDS = {"cpu": "CPU time", "launch": "launch time (CPU, not the GPU's time)"}


def _rows(doc: Report) -> list:
    return [r for r in (doc.get("compute_stacks") or {}).get("rows") or [] if r["share"] >= 0.005]


def compute_stacks_lines(doc: Report) -> list[str]:
    """'Model time by call site (stacks): ...', one line a row and the note; [] without."""
    cs = doc.get("compute_stacks")
    rows = _rows(doc)
    if not cs or not rows:
        return []
    what = TIME_WORDS.get(cs["time"], cs["time"])
    out = [
        f"Model time by call site (from the stacks; % of the loop's {cs['loop_samples']:.0f} "
        f"samples, {what}):"
    ]
    out += [
        f"  {r['share']:>6.1%}  {r['samples']:>7.0f} samples  {r['label']}"
        + (f"  `{r['code']}`" if r.get("code") else "")
        for r in rows[:MAX_SHOWN]
    ]
    if len(rows) > MAX_SHOWN:
        rest = sum(r["share"] for r in rows[MAX_SHOWN:])
        out.append(f"  {rest:>6.1%}  in {len(rows) - MAX_SHOWN} more rows (the report's JSON)")
    out.append(f"  {cs.get('note', '')}")
    return out


def compute_stacks_html(doc: Report, esc: Callable[[object], str]) -> str:
    """The same as an HTML section (esc: the page's escaping function); "" without one."""
    cs = doc.get("compute_stacks")
    rows = _rows(doc)
    if not cs or not rows:
        return ""
    head = "<tr><th>% of the loop</th><th>samples</th><th>where</th><th>line</th></tr>"
    cells = "".join(
        f"<tr><td>{r['share']:.1%}</td><td>{r['samples']:.0f}</td><td>{esc(r['label'])}</td>"
        f"<td><code>{esc(r.get('code') or '')}</code></td></tr>"
        for r in rows[:MAX_SHOWN]
    )
    return (
        "<h2>Model time by call site (stacks)</h2>"
        f"<p class=muted>{esc(cs.get('note', ''))}</p><table>{head}{cells}</table>"
    )
