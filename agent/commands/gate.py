"""`gpudiag gate`: fail CI on GPU-efficiency regressions, without failing on noise.

Exit codes: 0 pass, 1 regression, 2 usage or internal error, 3 inconclusive (too few runs,
an interval straddling a limit, or a baseline from a different environment).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudiag.agent.base.config import load_settings, read_section
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import atomic_write, dumps_json, parse_json, read_bounded
from gpudiag.agent.commands.gate_output import github_outputs, junit_xml, print_result
from gpudiag.agent.commands.options import FromArgs, positive
from gpudiag.agent.output.report import (
    MAX_REPORT_BYTES,
    check_writable,
    load_report,
    reading,
    report_of,
    write_report,
)
from gpudiag.analyzers.stats.gate import DIRECTIONS, Comparison, Limit, compare, overall
from gpudiag.probes.numbers import finite_number
from gpudiag.text.sink import emit

EXIT = {"pass": 0, "warn": 0, "fail": 1, "inconclusive": 3}
BASELINE_FORMAT = "gpudiag-gate-baseline"
DEFAULT_METRICS = (
    "steps_per_second",
    "samples_per_second",
    "step_time_p50_s",
    "step_time_p95_s",
    "data_wait_ratio",
    "gpu_busy",
    "cuda_peak_bytes",
)


@dataclass(frozen=True)
class GateConfig:
    """Limits per metric, runs, warm-up and the minimum effect size."""

    limits: tuple[Limit, ...]
    runs: int = 5
    warmup_steps: int = 5
    min_effect: float = 0.02
    source: str = "defaults"


def _limit_value(raw: object, where: str) -> tuple[float | None, bool | None]:
    """'10%' -> (0.10, relative); 0.1 -> (0.1, absolute); NaN and infinities refused in
    any spelling (`"nan%"`, `"inf"`)."""
    if raw is None:
        return None, None
    relative = isinstance(raw, str) and raw.strip().endswith("%")
    if isinstance(raw, str) and not relative:
        raise UsageError(f"{where}: expected a number or a percentage like '10%', got {raw!r}")
    try:
        return finite_number(raw, percent=True), relative
    except (ValueError, OverflowError):
        what = "a finite percentage" if relative else "a finite number or a percentage like '10%'"
        raise UsageError(f"{where}: expected {what}, got {raw!r}") from None


def load_gate_config(config: str | None, cwd: Path | None = None) -> GateConfig:
    """[tool.gpudiag.gate] of ./pyproject.toml, or the [gate] table of --config FILE."""
    section: dict = {}
    source = "defaults"
    if config:
        path = Path(config)
        if not path.is_file():
            raise UsageError(f"gate config not found: {config}")
        data = read_section(path, whole_file=True)
        section, source = data.get("gate", data), str(path)
    else:
        pp = (cwd or Path.cwd()) / "pyproject.toml"
        if pp.is_file():
            section = read_section(pp, whole_file=False).get("gate", {})
            source = f"{pp} [tool.gpudiag.gate]" if section else source
    if not isinstance(section, dict):
        raise UsageError(f"{source}: [gate] must be a table")
    metrics_cfg = section.get("metrics", {})
    if not isinstance(metrics_cfg, dict):
        raise UsageError(f"{source}: gate.metrics must be a table of metric tables")
    limits = {m: Limit(m, DIRECTIONS.get(m, "higher")) for m in DEFAULT_METRICS}
    for metric, cfg in metrics_cfg.items():
        limits[metric] = _metric_limit(metric, cfg, source, limits.get(metric))
    try:
        runs = int(section.get("runs", 5))
        warmup = int(section.get("warmup_steps", 5))
        min_effect = finite_number(section.get("min_effect", 0.02))
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{source}: runs, warmup_steps and min_effect must be numbers") from None
    return GateConfig(tuple(limits.values()), runs, warmup, min_effect, source)


def _metric_limit(metric: str, cfg: object, source: str, default: Limit | None) -> Limit:
    """One [gate.metrics.NAME] table as a Limit (`default`: gpudiag's own for the metric)."""
    where = f"{source}: gate.metrics.{metric}"
    if not isinstance(cfg, dict):
        raise UsageError(f"{where} must be a table (warn, fail, level, direction)")
    unknown = set(cfg) - {"warn", "fail", "level", "direction"}
    if unknown:
        raise UsageError(f"{where}: unknown keys {sorted(unknown)}")
    direction = cfg.get("direction", DIRECTIONS.get(metric))
    if direction not in ("higher", "lower"):
        raise UsageError(
            f"{where}: direction must be 'higher' or 'lower' (gpudiag does not know this metric's)"
        )
    warn, rel_w = _limit_value(cfg.get("warn"), where)
    fail, rel_f = _limit_value(cfg.get("fail"), where)
    if rel_w is not None and rel_f is not None and rel_w != rel_f:
        raise UsageError(f"{where}: warn and fail must both be percentages or both absolute")
    level = cfg.get("level", "error")
    if level not in ("off", "warn", "error"):
        raise UsageError(f"{where}: level must be off, warn or error")
    relative = rel_f if rel_f is not None else (rel_w if rel_w is not None else True)
    base = default or Limit(metric, direction)
    return Limit(
        metric,
        direction,
        warn if "warn" in cfg else (base.warn if relative else None),
        fail if "fail" in cfg else (base.fail if relative else None),
        relative,
        level,
    )


# ---- baselines and reports --------------------------------------------------------------
def fingerprint(env: dict) -> dict:
    """What must match for two runs to be comparable."""
    raw = env.get("gpus")
    gpus: list = raw if isinstance(raw, list) else []
    first = gpus[0] if gpus and isinstance(gpus[0], dict) else {}  # a crafted ['x']: no name
    return {
        "gpu": first.get("name") if isinstance(first.get("name"), str) else None,
        "gpus": len(gpus),
        "driver": env.get("driver"),
        "torch": env.get("torch"),
        "cpu_count": env.get("cpu_count"),
        "cpu_model": env.get("cpu_model"),
    }


def run_metrics(report: dict) -> dict[str, float | None]:
    """The gated metrics of one report (per-GPU busy share averaged as gpu_busy)."""
    m = dict(report.get("metrics", {}))
    busy = [
        v
        for k, v in m.items()
        if k.startswith("gpu") and k.endswith("_busy") and isinstance(v, (int, float))
    ]
    m["gpu_busy"] = statistics.fmean(busy) if busy else None
    return m


def load_baseline(path: str) -> tuple[list[dict], dict]:
    """(per-run metrics, fingerprint) from a gate baseline or a single gpudiag report."""
    doc = parse_json(read_bounded(path, MAX_REPORT_BYTES, "baseline"), f"baseline {path}")
    if not isinstance(doc, dict):
        raise UsageError(f"baseline {path} is not a gpudiag report or gate baseline")
    if doc.get("format") == BASELINE_FORMAT:
        runs = doc.get("runs")
        if (
            not isinstance(runs, list)
            or not all(isinstance(r, dict) for r in runs)
            or not all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                for r in runs
                for v in r.values()
            )
            or not isinstance(doc.get("fingerprint"), dict)
        ):
            raise UsageError(f"baseline {path} is malformed (runs and fingerprint needed)")
        return runs, doc["fingerprint"]
    report = load_report(path)
    with reading(path):
        return [run_metrics(report)], fingerprint(report["environment"])


def write_baseline(path: str, runs: list[dict], fp: dict) -> None:
    """Write a gate baseline atomically."""
    data = {
        "format": BASELINE_FORMAT,
        "version": 1,
        "created": time.time(),
        "fingerprint": fp,
        "runs": runs,
    }
    atomic_write(path, dumps_json(data, indent=2) + "\n", what="baseline")


# ---- the decision and its outputs -------------------------------------------------------
def decide(
    cfg: GateConfig, base_runs: list[dict], base_fp: dict, cur_runs: list[dict], cur_fp: dict
) -> tuple[str, list[Comparison], str]:
    """(overall verdict, comparisons, note)."""
    diff = {
        k: (base_fp.get(k), cur_fp.get(k))
        for k in set(base_fp) | set(cur_fp)
        if base_fp.get(k) != cur_fp.get(k)
    }
    if diff:
        note = (
            "not comparable: environment differs ("
            + "; ".join(f"{k}: baseline {a!r}, current {b!r}" for k, (a, b) in sorted(diff.items()))
            + ")"
        )
        return "inconclusive", [], note
    comps = [
        compare(
            lim,
            [v for r in base_runs if (v := r.get(lim.metric)) is not None],
            [v for r in cur_runs if (v := r.get(lim.metric)) is not None],
            cfg.min_effect,
        )
        for lim in cfg.limits
    ]
    comps = [c for c in comps if c.verdict != "skipped"]
    if not comps:
        return "inconclusive", [], "no gated metric was measured in both baseline and current"
    return overall(comps), comps, ""


# ---- running the job ---------------------------------------------------------------------
def profile_runs(
    command: list[str],
    runs: int,
    settings: Any,
    warmup_steps: int,
    duration: float | None,
    quiet: bool,
) -> list[dict]:
    """Run the job `runs` times under gpudiag (hooks injected); one report per run. A stop
    signal (SIGINT, SIGTERM, SIGHUP) ends the gate there: the job gets SIGTERM and gpudiag
    exits 128 + the signal, with no verdict and no baseline written."""
    from gpudiag.agent.session.signals import StopSignals

    reports: list[dict] = []
    with StopSignals() as stops:
        for i in range(runs):
            doc = _one_run(command, i, settings, warmup_steps, duration, stops)
            reports.append(doc)
            if not quiet:
                sps = doc["metrics"].get("steps_per_second")
                emit(
                    f"gpudiag gate: run {i + 1}/{runs} done"
                    + (f", {sps:.2f} steps/s" if sps else ", no step timing"),
                    file=sys.stderr,
                    flush=True,
                )
    return reports


def _one_run(
    command: list[str], i: int, settings: Any, warmup_steps: int, duration: Any, stops: Any
) -> dict:
    """One run of the job under gpudiag, its report; SystemExit when a stop signal came."""
    import subprocess

    from gpudiag.agent.session.launch import launch
    from gpudiag.agent.session.session import SessionOptions, SessionParts

    job = launch(command, stdout=subprocess.DEVNULL)
    opts = SessionOptions(duration_s=duration, progress=False, skip_steps=warmup_steps)
    session = job.session(settings, opts, parts=SessionParts(stop_signals=stops))
    result = session.run()
    popen = job.popen
    if popen.poll() is None:
        popen.terminate()
        popen.wait(timeout=30)
    if stops.stopping:
        name = signal.Signals(stops.signum).name
        emit(f"gpudiag gate: stopped by {name}: no verdict, no baseline written", file=sys.stderr)
        raise SystemExit(128 + int(stops.signum))
    if result.exit_code not in (None, 0):
        raise UsageError(f"run {i + 1}: the job exited with code {result.exit_code}")
    return report_of(result, mode="run", command=command, pid=session.target.pid, settings=settings)


def calibrate(cur_runs: list[dict], cfg: GateConfig) -> list[str]:
    """Suggested limits from the job's own run-to-run noise (as TOML)."""
    from gpudiag.analyzers.stats.gate import bootstrap_median_ci

    lines = [
        "# suggested by gpudiag gate --calibrate from "
        f"{len(cur_runs)} runs: fail = 3x the 95% half-width of the median (at least 5%)",
        "[tool.gpudiag.gate]",
        f"runs = {max(3, len(cur_runs))}",
        "",
    ]
    for lim in cfg.limits:
        vals = [v for r in cur_runs if (v := r.get(lim.metric)) is not None]
        if len(vals) < 2 or not lim.relative:
            continue
        med = statistics.median(vals)
        if not med:
            continue
        lo, hi = bootstrap_median_ci(vals)
        half = max(abs(hi - med), abs(med - lo)) / abs(med)
        fail = max(0.05, round(3 * half + 0.005, 2))
        lines += [
            f"[tool.gpudiag.gate.metrics.{lim.metric}]",
            f"# median {med:.4g}, 95% interval of the median +-{half:.1%}",
            f'warn = "{fail / 2:.0%}"',
            f'fail = "{fail:.0%}"',
            "",
        ]
    return lines


@dataclass(frozen=True)
class GateOptions(FromArgs):
    """`gpudiag gate`'s options (`cmd`: what follows `--`, None without it)."""

    baseline: str
    runs: int | None = None
    duration: float | None = None
    warmup_steps: int | None = None
    config: str | None = None
    update_baseline: bool = False
    calibrate: bool = False
    exit_zero: bool = False
    junit_xml: str | None = None
    html: str | None = None
    out: str | None = None
    quiet: bool = False
    reports: tuple[str, ...] = ()
    cmd: tuple[str, ...] | None = None


def main(args: GateOptions) -> int:
    """Compare runs (or saved reports) with a baseline; exit 0/1/3 (2 on errors)."""
    cfg = load_gate_config(args.config)
    runs = args.runs if args.runs is not None else cfg.runs
    warmup = args.warmup_steps if args.warmup_steps is not None else cfg.warmup_steps
    if runs < 1 or warmup < 0:
        raise UsageError("--runs must be at least 1 and --warmup-steps not negative")
    for path in (args.junit_xml, args.html):
        if path:
            check_writable(path)
    if args.cmd is not None:
        command = list(args.cmd)
        if not command:
            raise UsageError("gate needs a command after --")
        if args.reports:
            raise UsageError("gate takes -- CMD or report files, not both")
        if not (args.update_baseline or args.calibrate):
            base_runs, base_fp = load_baseline(args.baseline)
        settings = load_settings(None, None)
        reports = profile_runs(command, runs, settings, warmup, args.duration, args.quiet)
    elif args.reports:
        if args.update_baseline or args.calibrate:
            raise UsageError("--update-baseline and --calibrate run the job: give -- CMD")
        base_runs, base_fp = load_baseline(args.baseline)
        reports = [load_report(f) for f in args.reports]
    else:
        raise UsageError("gate needs -- CMD ARGS... to run, or report files to compare")
    with reading(", ".join(args.reports) or "the runs' reports"):
        cur_runs = [run_metrics(r) for r in reports]
        cur_fp = fingerprint(reports[-1]["environment"])
    if args.calibrate:
        emit("\n".join(calibrate(cur_runs, cfg)))
        return 0
    if args.update_baseline:
        check_writable(args.baseline)
        write_baseline(args.baseline, cur_runs, cur_fp)
        emit(f"gpudiag gate: baseline of {len(cur_runs)} runs written to {args.baseline}")
        return 0
    verdict, comps, note = decide(cfg, base_runs, base_fp, cur_runs, cur_fp)
    print_result(verdict, comps, note)
    github_outputs(verdict, comps, note)
    _write_outputs(args, cfg, reports[-1], verdict, comps, note)
    return 0 if args.exit_zero else EXIT[verdict]


def _write_outputs(
    args: GateOptions,
    cfg: GateConfig,
    report: dict,
    verdict: str,
    comps: list[Comparison],
    note: str,
) -> None:
    """The JUnit file, the last report with the gate's result, and its HTML page."""
    if args.junit_xml:
        junit_xml(args.junit_xml, comps, note)
    last = dict(report)
    last["gate"] = {
        "verdict": verdict,
        "note": note or None,
        "config": cfg.source,
        "baseline": args.baseline,
        "comparisons": [c.to_dict() for c in comps],
    }
    out = args.out or f"gpudiag-gate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_report(last, out)
    emit(f"Report with the gate result written to {out}")
    if args.html:
        from gpudiag.agent.output.exports import write_text
        from gpudiag.agent.output.render.formats import render

        emit(f"HTML page written to {write_text(render(last, 'html'), args.html)}")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `gate` subcommand and its options; the parser is returned: `gate` takes its
    options before or after its report files (argparse's intermixed parsing)."""
    p = sub.add_parser(
        "gate",
        help="fail CI when GPU efficiency regresses against a baseline",
        description="Run the job N times under gpudiag (or take saved reports) "
        "and compare its metrics with a baseline. Exit codes: 0 "
        "pass, 1 regression, 2 usage or internal error, 3 "
        "inconclusive (too few runs, interval straddling a limit, "
        "different environment).",
        usage="gpudiag gate --baseline BASE.json [options] (-- CMD [ARGS...] | CURRENT.json ...)",
    )
    p.add_argument(
        "--baseline",
        required=True,
        metavar="FILE",
        help="a gate baseline (from --update-baseline) or a gpudiag report",
    )
    p.add_argument("--runs", type=int, metavar="N", help="runs of the job (default: config or 5)")
    p.add_argument(
        "--duration",
        type=positive,
        metavar="SECONDS",
        help="profile each run this long (default: until the job exits)",
    )
    p.add_argument(
        "--warmup-steps",
        type=int,
        metavar="N",
        help="steps left out at the start of each run (default: config or 5)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML with a [gate] table (default: [tool.gpudiag.gate] of ./pyproject.toml)",
    )
    p.add_argument(
        "--update-baseline",
        action="store_true",
        help="write the runs as the new baseline instead of comparing",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="run the job N times and suggest limits from its own noise",
    )
    p.add_argument("--exit-zero", action="store_true", help="report but exit 0 (still 2 on errors)")
    p.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML file")
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the last run's report with the comparison as one HTML page",
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        help="report of the last run with the gate result (default: ./gpudiag-gate-<time>.json)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "reports",
        nargs="*",
        metavar="CURRENT.json",
        help="saved reports to compare (or -- CMD ARGS... to run the job; options "
        "may come before or after the reports, not after --)",
    )
    return p
