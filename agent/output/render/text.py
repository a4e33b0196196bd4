"""Render a report document as plain text (terminal) or markdown (tickets, PRs)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpudiag.agent.output.render.compute import compute_stacks_lines
from gpudiag.agent.output.render.plain import (
    bullets,
    job_dir,
    plain_basis,
    shorten_paths,
    split_evidence,
    wrapped,
)
from gpudiag.agent.output.render.ranks import rank_lines
from gpudiag.agent.output.render.right_size import price_age_lines, right_size_lines
from gpudiag.agent.output.render.workload import workload_lines
from gpudiag.agent.output.report_types import Evidence, Finding, Report, ReportRun
from gpudiag.analyzers.model.results import CATEGORIES
from gpudiag.text.formatting import (
    LABELS,
    evidence_parts,
    fmt_value,
    is_bound,
    period_parts,
    speedup_text,
)
from gpudiag.text.redact import redact_argv, redact_lines, shown
from gpudiag.text.trials import trial_lines

__all__ = ["LABELS", "fmt_value", "render_text", "render_markdown"]


# how a finding's impact reads by its speed-up kind: a hypothesis' is at most that, a floor's
# (the loading a model per batch costs, without its cold forwards) at least
IMPACT_WORD = {"hypothesis": "up to ", "floor": "at least "}


def _evidence_line(e: Mapping[str, Any]) -> str:
    return " ".join(evidence_parts(e))


def md_escape(text: str) -> str:
    """Text from the job (function names like `__getitem__`, paths) made literal in markdown:
    redacted and on one line first (an escape would hide a secret from the redactor)."""
    return re.sub(r"([\\`*_\[\]<>|~])", r"\\\1", shown(text))


def primary_evidence(f: Finding) -> Evidence | None:
    """The evidence a finding rests on: the first item that crossed a threshold."""
    return next(
        (e for e in f["evidence"] if e.get("threshold") is not None),
        f["evidence"][0] if f["evidence"] else None,
    )


def no_diagnosis_line(doc: Report) -> str | None:
    """Why there are too few loop samples for a diagnosis, or None when there are enough."""
    run, samples = doc["run"], doc["breakdown"]["samples"]
    need = doc.get("thresholds", {}).get("min_loop_samples", 0)
    if samples >= need:
        return None
    if run.get("end_reason") == "target_exited":
        code = run.get("exit_code")
        exited = f"the job exited with code {code}" if code is not None else "the job exited"
        exited += f" after {run['duration_s']:.1f} s"
        stacks = next((p for p in doc["probes"] if p["name"] == "stacks"), None)
        # no loop stack in the samples, or the job was gone before py-spy could look
        sampled = stacks is None or stacks["available"] or run["duration_s"] < 5
        # or the hooks were in the job and timed no step (py-spy may have come too late)
        hooks = next((p for p in doc["probes"] if p["name"] == "hooks"), None)
        timed = hooks is not None and hooks["available"]
        # a slow start-up can give py-spy a few samples of the interpreter starting: all
        # "other" and no timed step is still a job that never reached its loop
        no_loop = not samples or doc["breakdown"]["shares"].get("other", 0.0) >= 0.999
        if no_loop and (sampled or timed) and not doc["metrics"].get("steps"):
            return f"No diagnosis: {exited}, before its training loop started."
        return f"No diagnosis: {exited}, with {samples} loop samples ({need:.0f} needed)."
    stacks = next((p for p in doc["probes"] if p["name"] == "stacks"), None)
    if stacks is not None and not stacks["available"] and not samples:
        return (
            "No diagnosis: the stack probe is unavailable (see its fix under Probes): the time "
            "breakdown and the findings that need stacks cannot be made, however long it runs."
        )
    return (
        f"No diagnosis: {samples} loop samples, {need:.0f} needed (profile longer with --duration)."
    )


def stderr_tail_lines(doc: Report) -> list[str]:
    """The last lines the job wrote to stderr, when it failed."""
    tail = redact_lines(doc["run"].get("stderr_tail")) or []  # also reports from before
    if not tail:
        return []
    return ["", "Last lines of the job's stderr:"] + [f"  | {ln}" for ln in tail]


def _probe_state(p: Mapping[str, Any]) -> str:
    if p.get("info"):
        return "info"
    if p["available"]:
        return "degraded" if p.get("reason") else "ok"
    return "unavailable"


def _header(doc: Report) -> list[str]:
    run = doc["run"]
    cmd = " ".join(redact_argv(run.get("command")) or []) or "?"
    who = f"pid {run['pid']}" if run.get("pid") is not None else "recording"
    reason = run["end_reason"].replace("_", " ")
    extra = f", job exit code {run['exit_code']}" if run.get("exit_code") is not None else ""
    return [
        f"gpudiag {doc['tool']['version']} — {run['mode']} {who} ({cmd})",
        f"profiled {run['duration_s']:.1f} s, ended: {reason}{extra}",
    ] + process_lines(run)


def process_lines(run: ReportRun) -> list[str]:
    """A server whose model runs in worker processes: which process does what."""
    procs = run.get("processes") or []
    return [f"  pid {p['pid']}: {p['role']} ({p['what']})" for p in procs]


def _bar(share: float, width: int = 30) -> str:
    n = int(round(share * width))
    return "█" * n + "·" * (width - n)


def cost_lines(doc: Report) -> list[str]:
    """The cost summary: price and its source, spend, idle spend, if fixed, right-sizing."""
    cost = doc.get("cost") or {}
    if not cost.get("available"):
        return [f"Cost: no money figures ({cost.get('reason', 'not analysed')})."]
    p = cost["price"]
    out = [
        f"Cost: ${p['usd_per_gpu_hour']:.2f}/GPU-hour ({p['source']})",
        f"  {cost['gpus']}x {cost['gpu_model']}: ${cost['usd_per_hour']:,.2f}/hour, "
        f"${cost['usd_per_day']:,.0f}/day; idle {cost['gpu_idle_share']:.0%} = "
        f"${cost['idle']['usd_per_day']:,.0f}/day",
    ]
    out += price_age_lines(cost)
    unit = cost.get("unit", "step")
    per = cost.get("usd_per_1000_units", cost.get("usd_per_1000_steps"))
    if per is not None:
        out.append(
            f"  ${per:.4f} per 1,000 {unit}s"
            + (
                f", ${cost['usd_per_million_samples']:.2f} per million samples"
                if cost.get("usd_per_million_samples") is not None
                else ""
            )
        )
    fixed = cost.get("if_fixed")
    if fixed:
        out.append(
            f"  if {', '.join(fixed['findings'])} were fixed: "
            f"{speedup_text(fixed)} faster, idle "
            f"{fixed['gpu_idle_share']:.0%} = ${fixed['idle']['usd_per_day']:,.0f}/day"
        )
    sizing = cost.get("right_sizing")  # a report made before right_size
    if sizing and "right_size" not in doc:
        out.append(f"  right-sizing: {sizing['statement']}")
    if cost.get("spot"):
        out.append(f"  spot: {cost['spot']['note']}")
    return out


def phase_lines(doc: Report) -> list[str]:
    """Start-up (the job's paths relative to its folder), loop and shutdown, and the GPU's idle
    on the critical path; wrapped at WIDTH."""
    ph = doc.get("phases") or {}
    out = []
    if ph.get("source") and ph["source"] != "whole run":
        root = job_dir(doc)
        top = ", ".join(
            f"{shorten_paths(t['where'], root)} {t['share']:.0%}" for t in ph.get("startup_top", [])
        )
        # attached, gpudiag never saw the job start: the time before the loop is its own wait
        first = (
            "start-up" if doc.get("run", {}).get("mode") in ("run", "replay") else "before the loop"
        )
        out += wrapped(
            f"Run: {first} {ph['startup_s']:.1f} s"
            + (f" ({top})" if top else "")
            + f" · loop {ph['loop_s']:.1f} s (analysed; from {ph['source']}) · "
            f"shutdown {ph['shutdown_s']:.1f} s",
            "",
            "  ",
        )
    cp = doc.get("critical_path")
    if cp and cp.get("gpu_idle") is not None:
        parts = [f"{LABELS.get(k, k)} {v:.0%}" for k, v in cp.get("idle_by_wait", {}).items()]
        for key, label in (
            ("sync_bubbles", "after syncs"),
            ("host_bound", "host-bound"),
            ("unexplained", "unexplained"),
        ):
            if value := cp.get(key):
                parts.append(f"{label} {value:.0%}")
        out.append(
            f"GPU idle {cp['gpu_idle']:.0%} of the loop"
            + (": " + ", ".join(parts) if parts else "")
            + f" [{', '.join(cp.get('signals', []))}]"
        )
    if out:
        out.append("")
    return out


def period_lines(doc: Report) -> list[str]:
    """When the job changed: each period of a long loop with its top finding."""
    periods = doc.get("periods") or []
    if not periods:
        return []
    out = ["Over time (from the loop's start):"]
    for p in periods:
        span, what = period_parts(p)
        out.append(f"  {span}  {', '.join(what)}")
    return out


def render_text(doc: Report, verbose: bool = True) -> str:
    """The terminal summary: breakdown, ranked findings with fixes, probe status."""
    out = _header(doc) + workload_lines(doc)
    out.append("")
    out += phase_lines(doc)
    out += _breakdown_lines(doc["breakdown"])
    out.append("")
    out += rank_lines(doc)
    findings = doc["findings"]
    if not findings:
        out.append(
            no_diagnosis_line(doc) or "No bottleneck found: no finding crossed its threshold."
        )
    else:
        out.append(f"Findings ({len(findings)}, largest impact first):")
    root = job_dir(doc)
    for i, f in enumerate(findings, 1):
        out += _finding_lines(i, f, verbose, root)
    out += stderr_tail_lines(doc)
    out += period_lines(doc)
    out += trial_lines(doc)
    split = compute_stacks_lines(doc)
    out += split + ([""] if split else [])
    verdict = doc.get("verdict") or {}
    if verdict.get("statement") and (
        verdict.get("sure") or verdict.get("finding") or "not judged" in verdict["statement"]
    ):
        out.append(f"Verdict: {verdict['statement']}")  # (else "No diagnosis" said why)
    out.append("")
    out += cost_lines(doc)
    out += right_size_lines(doc)
    out.append("")
    out += _probe_lines(doc)
    return "\n".join(out)


def _breakdown_lines(bd: Mapping[str, Any]) -> list[str]:
    """Where the loop's time went, one bar per category of at least 0.5%."""
    if not bd["samples"]:
        return ["No stack samples of the loop: no time breakdown (see probes below)."]
    out = [f"Where the loop's time went ({bd['basis']}, {bd['samples']} samples):"]
    for c in CATEGORIES:
        s = bd["shares"].get(c, 0.0)
        if s >= 0.005:
            out.append(f"  {LABELS[c]:<24} {s:6.1%}  {_bar(s)}")
    return out


def _finding_lines(i: int, f: Finding, verbose: bool, root: str | None = None) -> list[str]:
    """One finding: its impact and speed-up, message, fix, and its evidence (verbose: what it
    rests on, then what was checked and stayed under its threshold) or the one piece that
    decided it. Wrapped at WIDTH; the job's paths relative to its folder (`root`) but in the
    location, which stays whole."""
    cost = f.get("cost") or {}
    money = f" · ${cost['usd_per_day']:,.0f}/day" if "usd_per_day" in cost else ""
    out = [
        f" {i}. [{f['severity']}] {f['id']} {f['title']}",
        f"    impact {IMPACT_WORD.get(f.get('speedup_kind') or '', '')}"
        f"{f['impact']:.0%} of wall time · "
        f"{'speed-up bound' if is_bound(f) else 'expected speed-up'} "
        f"{speedup_text(f)} · confidence {f['confidence']:.0%}{money}",
    ]
    out += wrapped(shorten_paths(f["message"], root), "    ")
    if f.get("speedup_basis"):
        out += wrapped(f"speed-up: {plain_basis(f['speedup_basis'])}", "    ", "      ")
    if f.get("location"):
        out.append(f"    at {f['location']}")
    out += wrapped(f"Fix: {shorten_paths(f['recommendation']['summary'], root)}", "    ", "      ")
    out += bullets([shorten_paths(a, root) for a in f["recommendation"]["actions"]], "     ", " -")
    if verbose:
        rests, context = split_evidence(f["evidence"])
        if rests:
            out.append("    Evidence:")
            out += bullets([_evidence_line(e) for e in rests], "     ", " ·")
        if context:
            out.append("    Context (checked; did not cross its threshold):")
            out += bullets([_evidence_line(e) for e in context], "     ", " ·")
    elif (why := primary_evidence(f)) is not None:
        out += wrapped(f"Why: {_evidence_line(why)}", "    ", "      ")
    return out


def _probe_lines(doc: Report) -> list[str]:
    """The probes' states, why one could not run and how to fix it, and the errors."""
    out = ["Probes: " + " · ".join(f"{p['name']} {_probe_state(p)}" for p in doc["probes"])]
    for p in doc["probes"]:
        if p.get("reason"):
            fix = "to get them" if p.get("info") else "fix"
            out.append(
                f"  {p['name']}: {p['reason']}"
                + (f" — {fix}: {p['hint']}" if p.get("hint") else "")
            )
    for e in doc["errors"]:
        out.append(f"  error [{e['source']}]: {e['message']}")
    return out


def _code_span(text: str) -> str:
    """`text` as a markdown code span (longer fences when it holds backticks), redacted and
    on one line."""
    text = shown(text)
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def render_markdown(doc: Report) -> str:
    """A markdown summary to paste into a ticket or pull request."""
    head = [md_escape(h) for h in _header(doc)]
    out = [f"### {head[0]}", "", head[1], ""]
    work = workload_lines(doc)
    if work:
        out += [md_escape(work[0]), ""] + [f"- {md_escape(ln.strip())}" for ln in work[1:]]
        out += [""] if work[1:] else []
    bd = doc["breakdown"]
    if bd["samples"]:
        out += ["| where the time went | share |", "|---|---:|"]
        for c in CATEGORIES:
            s = bd["shares"].get(c, 0.0)
            if s >= 0.005:
                out.append(f"| {LABELS[c]} | {s:.1%} |")
        out.append("")
    ranks = rank_lines(doc)
    if ranks:  # a multi-rank job: the rows per rank (and a hang's stacks) as they print
        out += ["```", *ranks[:-1], "```", ""]
    out += _md_findings(doc) if doc["findings"] else _md_no_findings(doc)
    out.append("#### Cost")
    out.append("")
    out += [
        md_escape(ln.strip()) if i == 0 else f"- {md_escape(ln.strip())}"
        for i, ln in enumerate(cost_lines(doc))
    ]
    out.append("")
    split = compute_stacks_lines(doc)
    if split:
        out += ["#### Model time by call site", "", "```", *split, "```", ""]
    sizing = right_size_lines(doc)
    if sizing:
        out += ["#### Right-size (model)", "", md_escape(sizing[0]), "", "```", *sizing[1:]]
        out += ["```", ""]
    missing = [p for p in doc["probes"] if not p["available"]]
    if missing:
        out.append(
            "Probes unavailable: "
            + "; ".join(
                f"{p['name']} ({md_escape(p.get('reason') or 'no reason')})" for p in missing
            )
        )
    return "\n".join(out).rstrip() + "\n"


def _md_findings(doc: Report) -> list[str]:
    """The findings' table, then each one's message, fix and evidence."""
    out = [
        "| # | id | severity | finding | impact | speed-up |",
        "|---|---|---|---|---:|---:|",
    ]
    for i, f in enumerate(doc["findings"], 1):
        out.append(
            f"| {i} | {f['id']} | {f['severity']} | {md_escape(f['title'])} | "
            f"{f['impact']:.0%} | {speedup_text(f)} |"
        )
    out.append("")
    root = job_dir(doc)
    for f in doc["findings"]:
        out += [f"**{f['id']}** — {md_escape(shorten_paths(f['message'], root))}", ""]
        if basis := f.get("speedup_basis"):
            out += [f"Speed-up: {md_escape(plain_basis(basis))}", ""]
        if where := f.get("location"):
            out += [f"Location: {_code_span(where)}", ""]
        out.append(f"Fix: {md_escape(shorten_paths(f['recommendation']['summary'], root))}")
        out += [
            f"- {_code_span(a)}"
            if a.startswith("DataLoader(")
            else f"- {md_escape(shorten_paths(a, root))}"
            for a in f["recommendation"]["actions"]
        ]
        out.append("")
        rests, context = split_evidence(f["evidence"])
        if rests:
            out += ["Evidence: " + "; ".join(md_escape(_evidence_line(e)) for e in rests), ""]
        if context:
            out.append(
                "Context (checked; did not cross its threshold): "
                + "; ".join(md_escape(_evidence_line(e)) for e in context)
            )
            out.append("")
    return out


def _md_no_findings(doc: Report) -> list[str]:
    """Why there is no diagnosis, and the last lines of the job's stderr."""
    out = [md_escape(no_diagnosis_line(doc) or "No finding crossed its threshold."), ""]
    tail = redact_lines(doc["run"].get("stderr_tail")) or []
    if tail:
        out += (
            ["Last lines of the job's stderr:", "", "```"]
            + [ln.replace("```", "` ` `") for ln in tail]
            + ["```", ""]
        )
    return out
