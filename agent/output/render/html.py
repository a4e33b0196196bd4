"""`--format html`: a report as one self-contained HTML page that opens offline.

Inline CSS and inline SVG (agent/output/render/charts.py), no script and no remote URL: nothing is
fetched when the page opens, it prints, and it is a few hundred KB at most because every
view it draws is bounded in the report (series, stacks, capture).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from gpudiag.agent.output.render.charts import (
    breakdown_svg,
    capture_steps_svg,
    color,
    flame_svg,
    gpu_legend,
    timeline_svg,
)
from gpudiag.agent.output.render.compute import compute_stacks_html
from gpudiag.agent.output.render.plain import job_dir, plain_basis, shorten_paths, split_evidence
from gpudiag.agent.output.render.right_size import right_size_lines, right_size_table_html
from gpudiag.agent.output.render.text import cost_lines, phase_lines
from gpudiag.agent.output.render.workload import workload_lines
from gpudiag.agent.output.report_types import Finding, Report
from gpudiag.text.formatting import LABELS, evidence_parts, fmt_value, is_bound, speedup_text
from gpudiag.text.trials import trial_lines

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;background:#fafafa;
color:#222}
main{max-width:1000px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:22px;margin:4px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;
padding-bottom:4px}
.muted{color:#777}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:10px 14px;
min-width:150px}.card b{display:block;font-size:20px}
.finding{background:#fff;border:1px solid #e2e2e2;border-left:6px solid #888;border-radius:6px;
padding:10px 14px;margin:10px 0}
.error{border-left-color:#d62728}.warning{border-left-color:#f0a30a}.note{border-left-color:#4c78a8}
.sev{font-size:11px;text-transform:uppercase;font-weight:700;letter-spacing:.05em}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{padding:3px 10px 3px 0;text-align:left;vertical-align:top}
th{color:#555;font-weight:600}code{background:#f0f0f0;padding:1px 4px;border-radius:3px}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.gpus{display:flex;gap:12px;flex-wrap:wrap}.chart{background:#fff}
pre{white-space:pre-wrap;font-size:12px}
"""


def _e(v: Any) -> str:
    return escape(str(v))


def _legend(categories: Any, extra: Sequence[tuple[str, str]] = ()) -> str:
    items = [(col, label) for label, col in extra] + [
        (color(c), LABELS.get(c, c)) for c in categories
    ]
    return (
        "<div class=legend>"
        + "".join(f'<span><i style="background:{c}"></i>{_e(t)}</span>' for c, t in items)
        + "</div>"
    )


def _cards(doc: Report) -> str:
    m = doc.get("metrics") or {}
    cp = doc.get("critical_path") or {}
    cost = doc.get("cost") or {}
    verdict = doc.get("verdict") or {}
    top = verdict.get("finding") or ("healthy" if verdict.get("sure", True) else "not sure yet")
    cards = [("Verdict", top, verdict.get("statement", ""))]
    if m.get("steps_per_s") is not None:
        cards.append(("Steps/s", f"{m['steps_per_s']:.2f}", "in-process hooks"))
    if cp.get("gpu_idle") is not None:
        cards.append(("GPU idle", f"{cp['gpu_idle']:.0%}", "of the loop"))
    if cost.get("available"):
        cards.append(
            ("Idle spend", f"${cost['idle']['usd_per_day']:,.0f}/day", "at the price shown")
        )
    ph = doc.get("phases") or {}
    if ph.get("loop_s") is not None:
        cards.append(("Loop analysed", f"{ph['loop_s']:.0f} s", ph.get("source", "")))
    return (
        "<div class=cards>"
        + "".join(
            f"<div class=card><span class=muted>{_e(t)}</span><b>{_e(v)}</b>"
            f"<span class=muted>{_e(s)}</span></div>"
            for t, v, s in cards
        )
        + "</div>"
    )


def _evidence_rows(items: list[Any]) -> str:
    return "".join(
        f"<tr><td><code>{_e(e['metric'])}</code></td><td>{_e(' '.join(evidence_parts(e, False)))}"
        "</td></tr>"
        for e in items
    )


def _finding(f: Finding, root: str | None = None) -> str:
    """One finding: its message (the job's paths under `root` made relative), the evidence it
    rests on, the checks that stayed under their threshold (context), the fix and speed-up."""
    rests, context = split_evidence(f.get("evidence", []))
    ev = f"<table><tr><th>evidence</th><th></th></tr>{_evidence_rows(rests)}</table>"
    if context:
        ev += (
            "<table><tr><th>context: checked, did not cross its threshold</th><th></th></tr>"
            f"{_evidence_rows(context)}</table>"
        )
    rec = f.get("recommendation") or {}
    actions = "".join(f"<li>{_e(shorten_paths(a, root))}</li>" for a in rec.get("actions", []))
    where = f"<p>Where: <code>{_e(f['location'])}</code></p>" if f.get("location") else ""
    speed = f.get("expected_speedup")
    lead = "Speed-up bound (no fix can beat it)" if is_bound(f) else "Expected speed-up if fixed"
    speed_line = (
        f"<p>{lead}: <b>{_e(speedup_text(f))}</b> "
        f"<span class=muted>({_e(plain_basis(f.get('speedup_basis', '')))})</span></p>"
        if speed and speed > 1.0
        else ""
    )
    return (
        f'<div class="finding {_e(f["severity"])}"><span class=sev>{_e(f["severity"])}</span> '
        f"<b>{_e(f['id'])}</b> {_e(f['title'])} <span class=muted>impact {f['impact']:.0%}, "
        f"confidence {f['confidence']:.0%}</span><p>{_e(shorten_paths(f['message'], root))}</p>"
        f"{ev}"
        f"<p><b>Fix:</b> {_e(shorten_paths(rec.get('summary', ''), root))}</p><ul>{actions}</ul>"
        f"{where}{speed_line}</div>"
    )


def _no_findings(doc: Report) -> str:
    verdict = doc.get("verdict") or {}
    if verdict.get("sure", True):
        return "<p>No findings: the job looks healthy.</p>"
    return f"<p>No findings yet: {_e(verdict.get('statement', 'too few samples'))}.</p>"


def _gpu_panels(doc: Report) -> str:
    gpus = (doc.get("environment") or {}).get("gpus") or []
    if not gpus:
        reason = next(
            (p.get("reason") for p in doc.get("probes", []) if p.get("name") == "gpu"), None
        )
        return f"<p class=muted>No GPU in this report{': ' + _e(reason) if reason else ''}.</p>"
    m = doc.get("metrics") or {}
    pts = (doc.get("series") or {}).get("points") or []
    out = []
    for g in gpus:
        i = str(g.get("index"))
        vals = [p["gpu_util"][i] for p in pts if i in p.get("gpu_util", {})]
        spark = ""
        if len(vals) > 1:
            path = " ".join(
                f"{'L' if k else 'M'}{200 * k / (len(vals) - 1):.1f},{40 * (1 - v):.1f}"
                for k, v in enumerate(vals)
            )
            spark = (
                '<svg viewBox="0 0 200 40" width="200" height="40"><path d="'
                f'{path}" fill="none" stroke="#1f77b4"/></svg>'
            )
        rows = [
            ("busy (NVML, loop)", fmt_value(m.get(f"gpu{i}_busy"), "ratio")),
            ("VRAM peak", fmt_value(m.get(f"gpu{i}_vram_peak_bytes"), "bytes")),
            ("VRAM total", fmt_value(g.get("memory_total_bytes"), "bytes")),
        ]
        table = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
        out.append(
            f"<div class=card><b>GPU {_e(i)}</b><span class=muted>{_e(g.get('name', ''))}</span>"
            f"{spark}<table>{table}</table></div>"
        )
    return "<div class=gpus>" + "".join(out) + "</div>"


def _cell(v: object) -> object:
    return round(v, 6) if isinstance(v, float) else v


def _rows(rows: list[dict], cols: tuple[str, ...]) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(_cell(r.get(c, '')))}</td>" for c in cols) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _idle_line(cap: Mapping[str, Any]) -> str:
    idle = cap.get("idle_by_host_s") or {}
    total = sum(idle.values())
    if total <= 0:
        return ""
    names = {
        "data": "waiting for data",
        "sync": "in a sync",
        "launch": "launching kernels",
        "profiler": "switching the profiler on",
    }
    parts = ", ".join(
        f"{names.get(k, 'in Python / own code')} {v / total:.0%}"
        for k, v in sorted(idle.items(), key=lambda kv: -kv[1])
        if v > 0
    )
    return f"<p>While idle, the loop thread was {_e(parts)}.</p>"


def _capture(doc: Report) -> str:
    cap = doc.get("capture")
    if not cap:
        return (
            "<p class=muted>No profiler capture in this report (<code>gpudiag run "
            "--capture-steps N</code> takes one).</p>"
        )
    steps = cap.get("steps", [])
    head = (
        f"<p>{len(steps)} steps captured on {_e(cap.get('device', 'cpu'))}, window "
        f"{cap.get('window_s', 0):.2f} s"
        + (f", profiler cost {cap['cost_s']:.2f} s" if cap.get("cost_s") is not None else "")
        + (
            f", tensor-core share of matrix kernels {cap['tensor_core_share']:.0%}"
            if cap.get("tensor_core_share") is not None
            else ""
        )
        + ". Blue: busy, red: idle.</p>"
        + _idle_line(cap)
        + "".join(
            f"<p><b>{'✔' if c['confirms'] else '✘'}</b> {_e(c['statement'])}</p>"
            for c in cap.get("checks", [])
        )
    )
    return (
        head
        + capture_steps_svg(steps)
        + "<h3>Top kernels</h3>"
        + _rows(cap.get("top_kernels", [])[:15], ("name", "time_s", "calls"))
        + "<h3>Top ops</h3>"
        + _rows(cap.get("top_ops", [])[:15], ("name", "time_s", "calls"))
        + "<h3>Copies</h3>"
        + _rows(cap.get("copies", []), ("kind", "direction", "bytes", "count", "time_s"))
        + "<h3>Synchronising calls</h3>"
        + _rows(cap.get("syncs", []), ("name", "count", "time_s"))
    )


def _num(v: Any, pct: bool = False) -> str:
    if not isinstance(v, (int, float)):
        return "n/a" if v is None else _e(str(v))
    return f"{v:+.1%}" if pct else f"{v:.4g}"


def _gate(doc: Report) -> str:
    """The CI gate's comparison with its baseline, failures first."""
    gate = doc.get("gate")
    if not gate:
        return ""
    order = ["fail", "inconclusive", "warn", "pass"]
    comps = sorted(
        gate.get("comparisons", []),
        key=lambda c: order.index(c["verdict"]) if c["verdict"] in order else 9,
    )
    colour = {"fail": "#d62728", "warn": "#f0a30a", "inconclusive": "#777", "pass": "#54a24b"}
    rows = "".join(
        f'<tr><td><code>{_e(c["metric"])}</code></td><td style="color:'
        f'{colour.get(c["verdict"], "#222")}"><b>{_e(c["verdict"].upper())}</b></td>'
        f"<td>{_num(c.get('baseline'))}</td><td>{_num(c.get('current'))}</td>"
        f"<td>{_num(c.get('delta'), True)}</td><td>[{_num(c.get('ci_low'), True)}, "
        f"{_num(c.get('ci_high'), True)}]</td>"
        f"<td>{_e(c.get('n_baseline'))}/{_e(c.get('n_current'))}</td></tr>"
        for c in comps
    )
    note = f"<p>{_e(gate['note'])}</p>" if gate.get("note") else ""
    return (
        f"<h2>CI gate: {_e(gate['verdict'].upper())}</h2>"
        f"<p class=muted>baseline {_e(gate.get('baseline', ''))}</p>{note}"
        "<table><tr><th>metric</th><th>verdict</th><th>baseline</th><th>current</th>"
        f"<th>delta</th><th>95% interval</th><th>n (b/c)</th></tr>{rows}</table>"
    )


def render_html(doc: Report) -> str:
    """The whole report as one self-contained HTML page."""
    run = doc.get("run") or {}
    cmd = " ".join(run.get("command") or []) or f"pid {run.get('pid')}"
    env = doc.get("environment") or {}
    shares = (doc.get("breakdown") or {}).get("shares") or {}
    series = doc.get("series") or {}
    cats = sorted({c for p in series.get("points", []) for c in p.get("phases", {})})
    findings = doc.get("findings") or []
    stacks = doc.get("stacks") or {}
    errors = "".join(
        f"<li>{_e(e.get('source'))}: {_e(e.get('message'))}</li>" for e in doc.get("errors", [])
    )
    probes = "".join(
        f"<li>{_e(p['name'])}: {'available' if p.get('available') else 'unavailable'}"
        f"{' - ' + _e(p['reason']) if p.get('reason') else ''}</li>"
        for p in doc.get("probes", [])
    )
    body = [
        f"<h1>gpudiag: {_e(cmd)}</h1>",
        f"<p class=muted>{_e(run.get('mode'))} · started {_e(run.get('start'))} · "
        f"{run.get('duration_s', 0):.0f} s · {_e(env.get('host', ''))} · Python "
        f"{_e(env.get('python', ''))} · torch {_e(env.get('torch') or 'n/a')}</p>",
        "".join(f"<p>{_e(ln.strip())}</p>" for ln in workload_lines(doc)),
        _cards(doc),
        _gate(doc),
        "<h2>Timeline</h2>",
        "<p class=muted>GPU utilisation, the loop thread's phases (its stack samples, per "
        "window) and the steps the hooks timed, over the run.</p>",
        timeline_svg(series, doc.get("capture")),
        _legend(cats, gpu_legend(series)),
        "<h2>Where the loop's time goes</h2>",
        f"<p class=muted>{_e((doc.get('breakdown') or {}).get('basis', ''))}</p>",
        breakdown_svg(shares),
        _legend([c for c, v in shares.items() if v > 0]),
        "<pre>" + _e("\n".join(phase_lines(doc))) + "</pre>",
        compute_stacks_html(doc, _e),
        f"<h2>Findings ({len(findings)})</h2>",
        "".join(_finding(f, job_dir(doc)) for f in findings) or _no_findings(doc),
        ("<h2>Fix trials</h2><pre>" + _e("\n".join(trial_lines(doc)[1:])) + "</pre>")
        if doc.get("trials")
        else "",
        "<h2>GPUs</h2>",
        _gpu_panels(doc),
        "<h2>Money</h2>",
        "<pre>" + _e("\n".join(cost_lines(doc))) + "</pre>",
        _right_size(doc),
        f"<h2>Flame graph of the loop thread</h2><p class=muted>{_e(stacks.get('thread') or '')}"
        f" · {stacks.get('samples', 0):.0f} samples over the loop; hover a frame for its "
        "share.</p>",
        flame_svg(stacks),
        _legend(sorted({s.get("category", "other") for s in stacks.get("stacks", [])})),
        "<h2>Profiler capture</h2>",
        _capture(doc),
        "<h2>Probes</h2>",
        f"<ul>{probes}</ul>",
        f"<h2>Errors</h2><ul>{errors}</ul>" if errors else "",
        f"<p class=muted>gpudiag {_e((doc.get('tool') or {}).get('version', ''))}, report "
        f"schema {_e(doc.get('schema_version'))}</p>",
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>gpudiag report: {_e(cmd)[:80]}</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def _right_size(doc: Report) -> str:
    """The right-size projection (a model): its basis, its table and its two picks."""
    lines = right_size_lines(doc)
    if not lines:
        return ""
    rs = doc["right_size"]
    picks = [ln for ln in lines[1:] if not ln.startswith("    ")]
    return (
        "<h3>Right-size (model)</h3>"
        f"<p class=muted>{_e(lines[0])}</p>"
        + right_size_table_html(doc, _e)
        + (
            "<pre>" + _e("\n".join(ln.strip() for ln in picks)) + "</pre>"
            if rs.get("available")
            else ""
        )
    )
