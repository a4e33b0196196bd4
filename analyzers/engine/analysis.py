"""Analyzers: pure functions from a timeline and thresholds to a time breakdown and findings.

`analyze` builds one context per analysed span (analyzers.context), runs the registered
finders over it (analyzers.finders) and finishes their findings once (analyzers.finalize)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gpudiag.analyzers.context.context import build_context, model_reloaded
from gpudiag.analyzers.cost.prices import Price
from gpudiag.analyzers.cost.projection import Prices, resolve_price
from gpudiag.analyzers.engine.finalize import finalize, unjudged, verdict_of
from gpudiag.analyzers.engine.registry import run_finders
from gpudiag.analyzers.measures.critical_path import CriticalPath
from gpudiag.analyzers.measures.loop import LoopProfile
from gpudiag.analyzers.measures.rules import Classifier, Rule
from gpudiag.analyzers.measures.window import LoopWindow, find_loop_window
from gpudiag.analyzers.measures.workload import Workload
from gpudiag.analyzers.model.results import Breakdown, Finding
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Aggregate, Timeline

__all__ = [
    "Analysis",
    "analyze",
    "Thresholds",
    "Timeline",
    "Rule",
    "Finding",
    "Breakdown",
    "unjudged",
    "verdict_of",
]


@dataclass(frozen=True)
class Analysis:
    """The result of analysing a timeline."""

    breakdown: Breakdown
    findings: tuple[Finding, ...]
    metrics: dict[str, float | None]
    profile: LoopProfile
    cost: dict = field(default_factory=dict)
    phases: dict = field(default_factory=dict)
    critical_path: CriticalPath | None = None
    verdict: dict = field(default_factory=dict)
    periods: list = field(default_factory=list)
    workload: Workload | None = None
    right_size: dict = field(default_factory=dict)
    compute: dict = field(default_factory=dict)  # the sampled steps' table by module
    compute_stacks: dict = field(default_factory=dict)  # the model's time by call site (stacks)


def analyze(
    tl: Timeline | Aggregate,
    thresholds: Thresholds | None = None,
    rules: tuple[Rule, ...] = (),
    price: Price | None = None,
    price_table: dict[str, float] | None = None,
) -> Analysis:
    """Breakdown, findings (sorted by impact, largest first) and costs for a timeline.

    The findings, breakdown, idle shares and money cover the loop's steady state (the
    analysis window); start-up and shutdown are summarised apart in `phases`.
    `price` overrides the GPU-hour price; `price_table` maps model keys or GPU names (or
    "default") to prices; otherwise the built-in reference table is used.
    """
    th = thresholds or Thresholds()
    clf = Classifier(rules)
    win = find_loop_window(tl, clf)
    win = replace(win, reloads=model_reloaded(tl, win, clf, th))
    view = (
        tl.window(win.start_ns, win.end_ns)
        if win.found and isinstance(tl, Timeline)
        else (tl.whole() if isinstance(tl, Timeline) else tl)
    )
    prices = Prices(price, price_table or {})
    analysis = _analyze_view(tl, view, win, th, clf, prices)
    return replace(analysis, periods=periods_of(tl, win, th, clf, prices))


def periods_of(
    tl: Timeline | Aggregate,
    win: LoopWindow,
    th: Thresholds,
    clf: Classifier,
    prices: Prices,
) -> list[dict]:
    """The loop cut into periods, each with its own top finding: when the job changed (healthy
    for 20 hours, then starved for 4) the report says when. Empty for a loop shorter than two
    periods of `period_s`."""
    if not isinstance(tl, Timeline):
        return []
    a = win.start_ns if win.found else tl.start_ns
    b = win.end_ns if win.found else tl.end_ns
    if a is None or b is None:
        return []
    loop_s = (b - a) / 1e9
    length = max(th.period_s, loop_s / th.max_periods)
    n = round(loop_s / length)
    if n < 2:
        return []
    step = int((b - a) / n)
    out = []
    for i in range(n):
        s0, s1 = a + i * step, a + (i + 1) * step
        part = _analyze_view(None, tl.window(s0, s1), win, th, clf, prices)
        top = next((f for f in part.findings if f.severity in ("error", "warning")), None)
        idle = part.critical_path.gpu_idle if part.critical_path else None
        out.append(
            {
                "start_s": round((s0 - a) / 1e9, 1),
                "end_s": round((s1 - a) / 1e9, 1),
                "finding": top.id if top else None,
                "severity": top.severity if top else None,
                "impact": round(top.impact, 4) if top else 0.0,
                "gpu_idle": None if idle is None else round(idle, 4),
                "samples": int(part.profile.samples),
                "sure": part.verdict.get("sure", False),
            }
        )
    return out


def _analyze_view(
    tl: Any,
    view: Aggregate,
    win: LoopWindow,
    th: Thresholds,
    clf: Classifier,
    prices: Prices,
) -> Analysis:
    c = build_context(tl, view, win, th, clf, prices)
    c = replace(c, price=resolve_price(list(c.stats), prices.current, prices.table))
    found = run_finders(c)
    for st in c.stats:
        c.metrics[f"gpu{st.index}_busy"] = st.busy
        c.metrics[f"gpu{st.index}_vram_peak_bytes"] = st.mem_peak
    c.metrics["gpus"] = float(len(c.stats))
    done = finalize(found, c, prices.current, prices.table)
    return Analysis(
        c.profile.breakdown,
        done.findings,
        c.metrics,
        c.profile,
        done.cost,
        c.phases,
        c.cp,
        done.verdict,
        workload=c.workload,
        right_size=c.right_size,
        compute=c.compute.to_dict() if c.compute is not None else {},
        compute_stacks=c.split.to_dict() if c.split is not None else {},
    )
