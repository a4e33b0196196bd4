"""`gpudiag gate`: fail CI on GPU-efficiency regressions, without failing on noise.

Exit codes: 0 pass, 1 regression, 2 usage or internal error, 3 inconclusive (too few runs,
an interval straddling a limit, or a baseline from a different environment).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from gpudiag.agent.config import _section
from gpudiag.agent.errors import UsageError
from gpudiag.analyzers.compare import DIRECTIONS, Comparison, Limit, compare, overall

EXIT = {"pass": 0, "warn": 0, "fail": 1, "inconclusive": 3}
BASELINE_FORMAT = "gpudiag-gate-baseline"
DEFAULT_METRICS = ("steps_per_second", "samples_per_second", "step_time_p50_s",
                   "step_time_p95_s", "data_wait_ratio", "gpu_busy", "cuda_peak_bytes")


@dataclass(frozen=True)
class GateConfig:
    """Limits per metric, runs, warm-up and the minimum effect size."""

    limits: tuple[Limit, ...]
    runs: int = 5
    warmup_steps: int = 5
    min_effect: float = 0.02
    source: str = "defaults"


def _limit_value(raw: object, where: str) -> tuple[float | None, bool | None]:
    """'10%' -> (0.10, relative); 0.1 -> (0.1, absolute)."""
    if raw is None:
        return None, None
    if isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            return float(raw.strip()[:-1]) / 100.0, True
        except ValueError:
            raise UsageError(f"{where}: {raw!r} is not a percentage") from None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise UsageError(f"{where}: expected a number or a percentage like '10%', got {raw!r}")
    return float(raw), False


def load_gate_config(config: str | None, cwd: Path | None = None) -> GateConfig:
    """[tool.gpudiag.gate] of ./pyproject.toml, or the [gate] table of --config FILE."""
    section: dict = {}
    source = "defaults"
    if config:
        path = Path(config)
        if not path.is_file():
            raise UsageError(f"gate config not found: {config}")
        data = _section(path, whole_file=True)
        section, source = data.get("gate", data), str(path)
    else:
        pp = (cwd or Path.cwd()) / "pyproject.toml"
        if pp.is_file():
            section = _section(pp, whole_file=False).get("gate", {})
            source = f"{pp} [tool.gpudiag.gate]" if section else source
    if not isinstance(section, dict):
        raise UsageError(f"{source}: [gate] must be a table")
    metrics_cfg = section.get("metrics", {})
    if not isinstance(metrics_cfg, dict):
        raise UsageError(f"{source}: gate.metrics must be a table of metric tables")
    limits = {m: Limit(m, DIRECTIONS.get(m, "higher")) for m in DEFAULT_METRICS}
    for metric, cfg in metrics_cfg.items():
        where = f"{source}: gate.metrics.{metric}"
        if not isinstance(cfg, dict):
            raise UsageError(f"{where} must be a table (warn, fail, level, direction)")
        unknown = set(cfg) - {"warn", "fail", "level", "direction"}
        if unknown:
            raise UsageError(f"{where}: unknown keys {sorted(unknown)}")
        direction = cfg.get("direction", DIRECTIONS.get(metric))
        if direction not in ("higher", "lower"):
            raise UsageError(f"{where}: direction must be 'higher' or 'lower' (gpudiag does "
                             "not know this metric's)")
        warn, rel_w = _limit_value(cfg.get("warn"), where)
        fail, rel_f = _limit_value(cfg.get("fail"), where)
        if rel_w is not None and rel_f is not None and rel_w != rel_f:
            raise UsageError(f"{where}: warn and fail must both be percentages or both "
                             "absolute")
        level = cfg.get("level", "error")
        if level not in ("off", "warn", "error"):
            raise UsageError(f"{where}: level must be off, warn or error")
        relative = rel_f if rel_f is not None else (rel_w if rel_w is not None else True)
        base = limits.get(metric, Limit(metric, direction))
        limits[metric] = Limit(metric, direction,
                               warn if "warn" in cfg else (base.warn if relative else None),
                               fail if "fail" in cfg else (base.fail if relative else None),
                               relative, level)
    try:
        runs = int(section.get("runs", 5))
        warmup = int(section.get("warmup_steps", 5))
        min_effect = float(section.get("min_effect", 0.02))
    except (TypeError, ValueError):
        raise UsageError(f"{source}: runs, warmup_steps and min_effect must be numbers") \
            from None
    return GateConfig(tuple(limits.values()), runs, warmup, min_effect, source)


# ---- baselines and reports --------------------------------------------------------------
def fingerprint(env: dict) -> dict:
    """What must match for two runs to be comparable."""
    gpus = env.get("gpus") or []
    return {"gpu": gpus[0].get("name") if gpus else None, "gpus": len(gpus),
            "driver": env.get("driver"), "torch": env.get("torch"),
            "cpu_count": env.get("cpu_count"), "cpu_model": env.get("cpu_model")}


def run_metrics(report: dict) -> dict[str, float | None]:
    """The gated metrics of one report (per-GPU busy share averaged as gpu_busy)."""
    m = dict(report.get("metrics", {}))
    busy = [v for k, v in m.items() if k.startswith("gpu") and k.endswith("_busy")
            and v is not None]
    m["gpu_busy"] = statistics.fmean(busy) if busy else None
    return m


def load_baseline(path: str) -> tuple[list[dict], dict]:
    """(per-run metrics, fingerprint) from a gate baseline or a single gpudiag report."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"baseline not found: {path}")
    try:
        doc = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UsageError(f"baseline {path} is not JSON") from None
    if not isinstance(doc, dict):
        raise UsageError(f"baseline {path} is not a gpudiag report or gate baseline")
    if doc.get("format") == BASELINE_FORMAT:
        runs = doc.get("runs")
        if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs) or \
                not isinstance(doc.get("fingerprint"), dict):
            raise UsageError(f"baseline {path} is malformed (runs and fingerprint needed)")
        return runs, doc["fingerprint"]
    from gpudiag.agent.report import load_report

    report = load_report(path)
    return [run_metrics(report)], fingerprint(report["environment"])


def write_baseline(path: str, runs: list[dict], fp: dict) -> None:
    """Write a gate baseline atomically."""
    data = {"format": BASELINE_FORMAT, "version": 1, "created": time.time(),
            "fingerprint": fp, "runs": runs}
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".baseline.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


# ---- the decision and its outputs -------------------------------------------------------
def decide(cfg: GateConfig, base_runs: list[dict], base_fp: dict, cur_runs: list[dict],
           cur_fp: dict) -> tuple[str, list[Comparison], str]:
    """(overall verdict, comparisons, note)."""
    diff = {k: (base_fp.get(k), cur_fp.get(k)) for k in set(base_fp) | set(cur_fp)
            if base_fp.get(k) != cur_fp.get(k)}
    if diff:
        note = "not comparable: environment differs (" + "; ".join(
            f"{k}: baseline {a!r}, current {b!r}" for k, (a, b) in sorted(diff.items())) + ")"
        return "inconclusive", [], note
    comps = [compare(lim, [r.get(lim.metric) for r in base_runs],
                     [r.get(lim.metric) for r in cur_runs], cfg.min_effect)
             for lim in cfg.limits]
    comps = [c for c in comps if c.verdict != "skipped"]
    if not comps:
        return "inconclusive", [], "no gated metric was measured in both baseline and current"
    return overall(comps), comps, ""


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4g}"


def _pct(v: float | None, relative: bool = True) -> str:
    if v is None:
        return "n/a"
    return f"{v:+.1%}" if relative else f"{v:.4g}"


HEADINGS = ("metric", "verdict", "baseline", "current", "delta", "95% interval", "n (b/c)",
            "limit")


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
    return (c.metric, c.verdict.upper(), _fmt(c.baseline), _fmt(c.current),
            _pct(c.delta, rel) if rel else "budget",
            f"[{_pct(c.ci_low, rel)}, {_pct(c.ci_high, rel)}]",
            f"{c.n_baseline}/{c.n_current}",
            (f"{c.limit:.0%}" if rel else _fmt(c.limit)) if c.limit is not None else "-")


def table(comps: list[Comparison]) -> list[str]:
    """The readable table: baseline, current, delta, interval and n per metric."""
    rows = [HEADINGS] + [_cells(c) for c in worst_first(comps)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def describe(c: Comparison) -> str:
    """One line naming the metric, the delta and the interval."""
    if c.baseline is None:
        return (f"{c.metric}: {_fmt(c.current)} against budget {_fmt(c.limit)} "
                f"(95% interval of the median {_fmt(c.ci_low)}..{_fmt(c.ci_high)}, "
                f"n={c.n_current}) — {c.reason}")
    return (f"{c.metric}: {_fmt(c.baseline)} -> {_fmt(c.current)} ({_pct(c.delta)}, 95% "
            f"interval {_pct(c.ci_low)}..{_pct(c.ci_high)}, n={c.n_baseline}/{c.n_current}, "
            f"fail limit {c.limit:.0%}) — {c.reason}" if c.limit is not None else
            f"{c.metric}: {_pct(c.delta)} — {c.reason}")


def github_outputs(verdict: str, comps: list[Comparison], note: str) -> None:
    """::error/::warning annotations (worst first) and a step-summary table."""
    if not os.environ.get("GITHUB_ACTIONS"):
        return
    for c in worst_first(comps):
        if c.verdict == "fail":
            print(f"::error title=gpudiag gate: {c.metric} regressed::{describe(c)}")
        elif c.verdict in ("warn", "inconclusive"):
            print(f"::warning title=gpudiag gate: {c.metric} {c.verdict}::{describe(c)}")
    if note:
        print(f"::warning title=gpudiag gate::{note}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        lines = [f"### gpudiag gate: {verdict.upper()}", ""]
        if note:
            lines += [note, ""]
        if comps:
            lines += ["| " + " | ".join(HEADINGS) + " |", "|" + "---|" * len(HEADINGS)]
            lines += ["| " + " | ".join(_cells(c)) + " |" for c in worst_first(comps)]
        with open(summary, "a") as f:
            f.write("\n".join(lines) + "\n")


def junit_xml(path: str, comps: list[Comparison], note: str) -> None:
    """One test case per metric; failures for regressions, skipped for inconclusive."""
    cases = []
    for c in comps:
        body = ""
        if c.verdict == "fail":
            body = f'<failure message="{escape(describe(c), {chr(34): "&quot;"})}"/>'
        elif c.verdict == "inconclusive":
            body = f'<skipped message="{escape(describe(c), {chr(34): "&quot;"})}"/>'
        cases.append(f'  <testcase classname="gpudiag.gate" name="{escape(c.metric)}">'
                     f"{body}</testcase>")
    fails = sum(c.verdict == "fail" for c in comps)
    skipped = sum(c.verdict == "inconclusive" for c in comps)
    xml = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<testsuite name="gpudiag gate" tests="{len(comps)}" failures="{fails}" '
           f'skipped="{skipped}">']
    if note:
        xml.append(f"  <properties><property name=\"note\" value=\""
                   f"{escape(note, {chr(34): '&quot;'})}\"/></properties>")
    xml += cases + ["</testsuite>"]
    Path(path).write_text("\n".join(xml) + "\n")


def print_result(verdict: str, comps: list[Comparison], note: str) -> None:
    """The table and the verdict line on stdout."""
    if comps:
        print("\n".join(table(comps)))
    if note:
        print(note)
    worst = [c for c in worst_first(comps) if c.verdict in ("fail", "inconclusive")]
    for c in worst:
        print(("REGRESSION " if c.verdict == "fail" else "INCONCLUSIVE ") + describe(c))
    print(f"gpudiag gate: {verdict.upper()}")
    sys.stdout.flush()


# ---- running the job ---------------------------------------------------------------------
def profile_runs(command: list[str], runs: int, settings, warmup_steps: int,
                 duration: float | None, quiet: bool) -> list[dict]:
    """Run the job `runs` times under gpudiag (hooks injected); one report per run."""
    import subprocess

    from gpudiag.agent.cli import find_python_process
    from gpudiag.agent.environment import describe_environment
    from gpudiag.agent.report import build_report
    from gpudiag.agent.session import Session, SessionOptions, default_probes
    from gpudiag.probes.base import ProbeStatus, Target
    from gpudiag.probes.inprocess import HookProbe, injection_env

    reports = []
    for i in range(runs):
        hooks = HookProbe()
        hooks.open(Target(0))
        env = injection_env(dict(os.environ), hooks.path or "")
        try:
            popen = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
        except OSError as exc:
            hooks.close()
            raise UsageError(f"cannot start {command[0]!r}: {exc.strerror}") from None
        opts = SessionOptions(duration_s=duration, progress=False, skip_steps=warmup_steps)
        target = find_python_process(popen)
        session = Session(Target(target), settings, opts,
                          probes=default_probes(opts) + [hooks], popen=popen)
        session.statuses[hooks.name] = ProbeStatus(hooks.name, True)
        result = session.run()
        if popen.poll() is None:
            popen.terminate()
            popen.wait(timeout=30)
        if result.exit_code not in (None, 0):
            raise UsageError(f"run {i + 1}: the job exited with code {result.exit_code}")
        doc = build_report(analysis=result.analysis, mode="run", command=command, pid=target,
                           start=result.start, end=result.end, end_reason=result.end_reason,
                           exit_code=result.exit_code,
                           environment=describe_environment(target, result.hardware),
                           probes=result.probes, errors=result.errors,
                           thresholds=settings.thresholds, settings_source=settings.source,
                           agent=result.agent)
        reports.append(doc)
        if not quiet:
            sps = doc["metrics"].get("steps_per_second")
            print(f"gpudiag gate: run {i + 1}/{runs} done"
                  + (f", {sps:.2f} steps/s" if sps else ", no step timing"), file=sys.stderr,
                  flush=True)
    return reports


def calibrate(cur_runs: list[dict], cfg: GateConfig) -> list[str]:
    """Suggested limits from the job's own run-to-run noise (as TOML)."""
    from gpudiag.analyzers.compare import bootstrap_median_ci

    lines = ["# suggested by gpudiag gate --calibrate from "
             f"{len(cur_runs)} runs: fail = 3x the 95% half-width of the median (at least 5%)",
             "[tool.gpudiag.gate]", f"runs = {max(3, len(cur_runs))}", ""]
    for lim in cfg.limits:
        vals = [r.get(lim.metric) for r in cur_runs if r.get(lim.metric) is not None]
        if len(vals) < 2 or not lim.relative:
            continue
        med = statistics.median(vals)
        if not med:
            continue
        lo, hi = bootstrap_median_ci(vals)
        half = max(abs(hi - med), abs(med - lo)) / abs(med)
        fail = max(0.05, round(3 * half + 0.005, 2))
        lines += [f"[tool.gpudiag.gate.metrics.{lim.metric}]",
                  f"# median {med:.4g}, 95% interval of the median +-{half:.1%}",
                  f'warn = "{fail / 2:.0%}"', f'fail = "{fail:.0%}"', ""]
    return lines
