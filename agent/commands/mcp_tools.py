"""What `gpudiag mcp`'s tools do, as plain functions over typed values (no MCP import here):
each calls the code a command calls (`attach`, the gate's `decide`, the catalogue's generated
documentation, `try`) and returns a bounded, redacted dict. Bad input raises UsageError (one
line); the server turns it into the tool's one error."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.fleet.identity import other_user
from gpudiag.agent.output.report import load_report
from gpudiag.analyzers.model.catalogue import Spec
from gpudiag.probes.spawn import start_process
from gpudiag.text.redact import redact_argv, shown

MAX_SECONDS = 600.0  # the longest diagnosis one call may ask for
MAX_FINDINGS = 20  # findings returned (the report holds them all)
MAX_EVIDENCE = 12  # evidence rows per finding
MAX_TEXT = 2000  # characters of one string field
MAX_REPORTS = 200  # saved reports listed
MAX_JOBS = 200  # processes listed
TRY_TIMEOUT_S = 3600.0  # a `try` run's wall-clock limit

CLI = "import sys; from gpudiag.agent.cli.main import main; sys.exit(main(sys.argv[1:]))"
Progress = Callable[[float, float | None, str], None]  # (done, total or None, message)


@dataclass(frozen=True)
class McpConfig:
    """What the server was started with: where reports are kept (diagnose writes there;
    every report a tool reads must be there) and whether `try_fix` may run jobs."""

    reports: Path
    allow_try: bool = False


def text(value: object, limit: int = MAX_TEXT) -> str:
    """A string field of a tool's result: secrets hidden, controls removed, bounded."""
    out = shown(str(value), lines=True)
    return out if len(out) <= limit else out[: limit - 1] + "…"


# ---- list_jobs ---------------------------------------------------------------------------
def may_profile(pid: int) -> str | None:
    """None when this user may profile `pid` (attach's own check); else why not."""
    return other_user(pid)


def list_jobs(snapshot: Callable[[], dict] | None = None) -> dict:
    """What `gpudiag top` sees (GPU and Python processes), only those the caller may
    profile; the count of the others is given, never their details."""
    if snapshot is None:
        from gpudiag.probes.box import BoxSampler

        sampler = BoxSampler()
        try:
            snap = sampler.snapshot()
        finally:
            sampler.close()
    else:
        snap = snapshot()
    jobs, hidden = [], 0
    for row in snap.get("processes", []):
        if may_profile(int(row["pid"])) is not None:
            hidden += 1
            continue
        jobs.append(
            {
                "pid": int(row["pid"]),
                "user": text(row.get("user") or "?", 64),
                "command": text(" ".join(redact_argv(str(row.get("command", "")).split()) or [])),
                "gpus": text(row.get("gpus") or "-", 200),
                "cpu_percent": float(row.get("cpu") or 0.0),
                "rss_bytes": int(row.get("rss") or 0),
                "python": bool(row.get("python")),
            }
        )
    gpus = [_gpu_row(g) for g in snap.get("gpus", [])]
    return {
        "jobs": jobs[:MAX_JOBS],
        "gpus": gpus,
        "hidden_other_users": hidden,
        "truncated": len(jobs) > MAX_JOBS,
    }


def _gpu_row(g: dict) -> dict:
    """One GPU of the box: index, name, utilisation and memory."""

    def num(key: str) -> float | None:
        v = g.get(key)
        return float(v) if isinstance(v, (int, float)) else None

    return {
        "index": text(g.get("index"), 16),
        "name": text(g.get("name") or "?", 128),
        "util_gpu": num("util_gpu"),
        "mem_used_bytes": num("mem_used"),
        "mem_total_bytes": num("mem_total"),
    }


# ---- diagnose ----------------------------------------------------------------------------
_DIAGNOSING = threading.Lock()  # one diagnosis at a time: the agent's CPU budget is the box's


@dataclass(frozen=True)
class DiagnoseRequest:
    """A diagnose call's typed input."""

    pid: int
    seconds: float = 30.0
    until_sure: bool = True
    hooks: bool = False


def check_request(req: DiagnoseRequest) -> int:
    """The pid checked as `attach` checks it, and the caller's right to profile it."""
    from gpudiag.agent.commands.attach import parse_pid

    if not 1 <= req.seconds <= MAX_SECONDS:
        raise UsageError(f"seconds must be from 1 to {MAX_SECONDS:g}, got {req.seconds:g}")
    pid = parse_pid(str(req.pid))
    if (why := may_profile(pid)) is not None:
        raise UsageError(f"cannot attach: {why}")
    return pid


def diagnose(cfg: McpConfig, req: DiagnoseRequest) -> dict:
    """Attach to `req.pid` as `gpudiag attach --duration S [--until-sure]` does (the same
    function), write the report into the reports folder and return its summary."""
    from gpudiag.agent.commands.attach import attach
    from gpudiag.agent.session.session import SessionOptions
    from gpudiag.agent.session.wiring import Outputs

    pid = check_request(req)
    if not _DIAGNOSING.acquire(blocking=False):
        raise UsageError("a diagnosis is already running; wait for it to finish")
    try:
        cfg.reports.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = cfg.reports / f"gpudiag-{pid}-{stamp}.json"
        opts = SessionOptions(
            duration_s=req.seconds,
            until_sure=req.until_sure,
            attached=True,
            load_hooks=req.hooks,
            progress=False,
        )
        attach(pid, load_settings(None), opts, Outputs(quiet=True, stdout=False), str(out))
    finally:
        _DIAGNOSING.release()
    return summary(load_report(str(out)), out)


def summary(doc: dict, path: Path | str) -> dict:
    """A report as a tool returns it: the verdict, the breakdown, the findings (bounded) and
    the report's path."""
    verdict = doc.get("verdict") or {}
    shares = (doc.get("breakdown") or {}).get("shares") or {}
    findings = doc.get("findings") or []
    run = doc.get("run") or {}
    return {
        "report": str(path),
        "verdict": {
            "finding": verdict.get("finding"),
            "sure": bool(verdict.get("sure")),
            "confidence": verdict.get("confidence"),
            "statement": text(verdict.get("statement") or ""),
        },
        "workload": (doc.get("workload") or {}).get("kind") or "unknown",
        "breakdown": {k: float(v) for k, v in shares.items() if isinstance(v, (int, float))},
        "findings": [finding_row(f) for f in findings[:MAX_FINDINGS]],
        "findings_total": len(findings),
        "run": {
            "mode": run.get("mode"),
            "pid": run.get("pid"),
            "command": [text(a, 500) for a in (redact_argv(run.get("command") or []) or [])][:64],
            "duration_s": run.get("duration_s"),
        },
    }


def finding_row(f: dict) -> dict:
    """One finding: id, impact, speed-up, the fix and its evidence."""
    rec = f.get("recommendation") or {}
    return {
        "id": f.get("id"),
        "title": text(f.get("title") or ""),
        "severity": f.get("severity"),
        "confidence": f.get("confidence"),
        "impact": f.get("impact"),
        "expected_speedup": f.get("expected_speedup"),
        "speedup_kind": f.get("speedup_kind"),
        "message": text(f.get("message") or ""),
        "fix": {
            "summary": text(rec.get("summary") or ""),
            "actions": [text(a, 500) for a in (rec.get("actions") or [])][:10],
        },
        "evidence": [_evidence(e) for e in (f.get("evidence") or [])[:MAX_EVIDENCE]],
        "location": text(f["location"], 500) if f.get("location") else None,
        "usd_per_hour": (f.get("cost") or {}).get("usd_per_hour"),
    }


def _evidence(e: dict) -> dict:
    return {
        "metric": text(e.get("metric"), 128),
        "value": e.get("value"),
        "unit": e.get("unit"),
        "threshold": e.get("threshold"),
        "comparison": e.get("comparison"),
        "setting": e.get("setting"),
        "source": text(e.get("source") or "", 200),
    }


# ---- saved reports -----------------------------------------------------------------------
def report_path(cfg: McpConfig, name: str) -> Path:
    """A report the caller names, which must lie in the reports folder (a name there or a
    path inside it); UsageError otherwise."""
    if not name or "\0" in name:
        raise UsageError("name a report (a file in the reports folder)")
    root = cfg.reports.resolve()
    given = Path(name)
    path = (given if given.is_absolute() else root / given).resolve()
    if root != path.parent and root not in path.parents:
        raise UsageError(f"report {name!r} is not in the reports folder {root}")
    if not path.is_file():
        raise UsageError(f"no report {name!r} in {root}")
    return path


def read_report(cfg: McpConfig, name: str) -> tuple[dict, Path]:
    """A saved report, read and validated as `gpudiag report` does."""
    path = report_path(cfg, name)
    return load_report(str(path)), path


def saved_reports(cfg: McpConfig) -> list[dict]:
    """The reports in the reports folder, newest first (name, size, modified)."""
    if not cfg.reports.is_dir():
        return []
    files = [p for p in cfg.reports.glob("*.json") if p.is_file()]
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [
        {"name": p.name, "bytes": p.stat().st_size, "modified": p.stat().st_mtime}
        for p in files[:MAX_REPORTS]
    ]


# ---- explain -----------------------------------------------------------------------------
def catalogue() -> list[dict]:
    """Every finding id the catalogue holds: id, title, category."""
    from gpudiag.analyzers.engine.catalogue_doc import catalogue as specs  # every unit

    return [
        {"id": s.id, "title": s.title, "category": s.category}
        for s in sorted(specs().values(), key=lambda s: s.id)
    ]


def finding_spec(finding: str) -> Spec:
    """The spec of a finding id (case-insensitive); UsageError for an unknown one."""
    from gpudiag.analyzers.engine.catalogue_doc import catalogue as specs  # every unit

    fid = finding.strip().upper()
    if fid not in specs():
        raise UsageError(f"no finding {finding[:40]!r} in the catalogue (e.g. DATA001)")
    return specs()[fid]


def explain(cfg: McpConfig, finding: str, report: str | None = None) -> dict:
    """A finding's generated documentation (docs/findings.md's section) and the thresholds
    its unit reads, with their defaults; with `report`, that report's finding and the
    values its thresholds had there."""
    from gpudiag.analyzers.engine.catalogue_doc import finding_doc, owners, spec_settings
    from gpudiag.analyzers.model.thresholds import Thresholds

    spec = finding_spec(finding)
    module = owners().get(spec.id)
    names = spec_settings(spec, module)
    th = Thresholds()
    out: dict = {
        "id": spec.id,
        "title": spec.title,
        "category": spec.category,
        "documentation": finding_doc(spec, module),
        "thresholds": {n: getattr(th, n) for n in names},
        "in_report": None,
    }
    if report:
        doc, path = read_report(cfg, report)
        used = doc.get("thresholds") or {}
        out["thresholds"] = {n: used.get(n, v) for n, v in out["thresholds"].items()}
        found = [f for f in doc.get("findings") or [] if f.get("id") == spec.id]
        row = finding_row(found[0]) if found else None
        out["in_report"] = {"report": str(path), "finding": row}
    return out


# ---- compare -----------------------------------------------------------------------------
def compare(cfg: McpConfig, baseline: str, current: str) -> dict:
    """Two saved reports compared as `gpudiag gate BASELINE CURRENT` compares them (its
    config, its noise-aware comparisons, its verdict)."""
    from gpudiag.agent.commands.gate import (
        decide,
        fingerprint,
        load_baseline,
        load_gate_config,
        run_metrics,
    )

    base_path = report_path(cfg, baseline)
    cur_doc, cur_path = read_report(cfg, current)
    base_runs, base_fp = load_baseline(str(base_path))
    verdict, comps, note = decide(
        load_gate_config(None),
        base_runs,
        base_fp,
        [run_metrics(cur_doc)],
        fingerprint(cur_doc["environment"]),
    )
    return {
        "baseline": str(base_path),
        "current": str(cur_path),
        "verdict": verdict,
        "note": text(note) if note else None,
        "comparisons": [c.to_dict() for c in comps],
    }


# ---- try_fix -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TryRequest:
    """A try_fix call's typed input: the report whose recorded command is tried."""

    report: str
    finding: str | None = None
    rounds: int = 3
    seconds: float = 10.0


def try_command(cfg: McpConfig, req: TryRequest) -> tuple[list[str], Path, Path]:
    """`gpudiag try --from REPORT -- CMD` for the command recorded in the report (never a
    command the caller gives); refused unless the server was started with --allow-try."""
    if not cfg.allow_try:
        raise UsageError("try_fix is off: start the server with `gpudiag mcp --allow-try`")
    if not 1 <= req.rounds <= 10 or not 1 <= req.seconds <= 120:
        raise UsageError("rounds must be from 1 to 10 and seconds from 1 to 120")
    doc, path = read_report(cfg, req.report)
    run = doc.get("run") or {}
    command = [str(a) for a in run.get("command") or []]
    if run.get("mode") != "run" or not command:
        raise UsageError(
            f"report {path.name} records no launched command (mode {run.get('mode')!r}): "
            "try_fix runs only a command `gpudiag run` recorded"
        )
    if any("***" in a for a in command):
        raise UsageError(f"report {path.name}'s command had a secret hidden: it cannot be rerun")
    if req.finding is not None:
        finding_spec(req.finding)
    out = path.with_name(f"{path.stem}-try-{time.strftime('%Y%m%d-%H%M%S')}.json")
    argv = [sys.executable, "-c", CLI, "try", "--from", str(path)]
    argv += ["--finding", req.finding.strip().upper()] if req.finding else []
    argv += ["--rounds", str(req.rounds), "--seconds", f"{req.seconds:g}", "--out", str(out)]
    return [*argv, "--", *command], path, out


def try_fix(cfg: McpConfig, req: TryRequest, progress: Progress | None = None) -> dict:
    """Run `gpudiag try` on a report's command, each of its progress lines passed to
    `progress`; the trials it measured."""
    argv, path, out = try_command(cfg, req)
    proc = start_process(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        cwd=os.getcwd(),
    )
    lines: list[str] = []
    deadline = time.monotonic() + TRY_TIMEOUT_S
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = text(raw.rstrip("\n"), 500)
        lines = [*lines[-49:], line]
        if progress is not None:
            progress(float(len(lines)), None, line)
        if time.monotonic() > deadline:
            proc.kill()
            break
    rc = proc.wait()
    trials: list[dict] = []
    if out.is_file():
        trials = (load_report(str(out)).get("trials") or [])[:MAX_FINDINGS]
    return {
        "report": str(path),
        "trials_report": str(out) if out.is_file() else None,
        "exit_code": rc,
        "trials": trials,
        "output_tail": lines[-20:],
    }
