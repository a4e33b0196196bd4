"""Analyzers: pure functions from a timeline and thresholds to a time breakdown and findings."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpudiag.analyzers.catalogue import category, explains_gpu_idle, ranked, severity, spec
from gpudiag.analyzers.checkpoint import checkpoint_findings
from gpudiag.analyzers.cost import checkpoints_seen, cost_analysis, resolve_price
from gpudiag.analyzers.critical_path import CriticalPath, critical_path, refine_with_hooks
from gpudiag.analyzers.gil import gil_findings, gil_judged
from gpudiag.analyzers.gpu import gpu_findings
from gpudiag.analyzers.gpu_stats import gpu_compute, gpu_stats, job_gpu_idle, link_bound
from gpudiag.analyzers.host_bound import host_findings
from gpudiag.analyzers.host_contention import host_contention_findings
from gpudiag.analyzers.loop import LoopProfile, profile_loop, thread_series_mean
from gpudiag.analyzers.metrics import host_metrics
from gpudiag.analyzers.pipeline import data_findings
from gpudiag.analyzers.prices import Price
from gpudiag.analyzers.results import Breakdown, Evidence, Finding, Recommendation
from gpudiag.analyzers.rules import Classifier, Rule
from gpudiag.analyzers.storage import io_findings
from gpudiag.analyzers.sync import sync_findings
from gpudiag.analyzers.thresholds import Thresholds
from gpudiag.analyzers.throughput import sync_sites, throughput_metrics
from gpudiag.analyzers.timeline import Aggregate, Timeline
from gpudiag.analyzers.window import LoopWindow, find_loop_window, phase_summary

__all__ = ["Analysis", "analyze", "Thresholds", "Timeline", "Rule", "Finding", "Breakdown"]


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
    view = (
        tl.window(win.start_ns, win.end_ns)
        if win.found and isinstance(tl, Timeline)
        else (tl.whole() if isinstance(tl, Timeline) else tl)
    )
    analysis = _analyze_view(tl, view, win, th, clf, price, price_table)
    return replace(analysis, periods=periods_of(tl, win, th, clf, price, price_table))


def periods_of(
    tl: Timeline | Aggregate,
    win: LoopWindow,
    th: Thresholds,
    clf: Classifier,
    price: Price | None,
    price_table: dict[str, float] | None,
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
        part = _analyze_view(None, tl.window(s0, s1), win, th, clf, price, price_table)
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
    tl,
    view: Aggregate,
    win: LoopWindow,
    th: Thresholds,
    clf: Classifier,
    price: Price | None,
    price_table: dict[str, float] | None,
) -> Analysis:
    stats = [s for s in gpu_stats(view) if s.samples > 0]
    uses_gpu = any(s.job_uses_gpu for s in stats)
    profile = profile_loop(
        view,
        clf,
        backward_elsewhere=uses_gpu,
        gil_other_min=th.gil_other_min,
    )
    metrics = host_metrics(view)
    # step rows only exist inside the loop: read them over the whole run, so no step at the
    # window's edges is lost
    metrics.update(throughput_metrics(tl.whole() if isinstance(tl, Timeline) else view))
    metrics["stack_samples"] = profile.samples
    metrics["startup_samples"] = profile.startup_samples
    if profile.thread is not None:
        metrics["loop_thread_cpu"] = profile.loop_cpu
        metrics["loop_thread_d_state"] = thread_series_mean(view, "d_state", profile.thread.tid)
    loader_d = None
    if profile.loader is not None:
        loader_d = (
            metrics.get("worker_d_state_share")
            if profile.loader.source == "workers"
            else metrics.get("loop_thread_d_state")
        )
    shares = refine_with_hooks(dict(profile.breakdown.shares), metrics)
    if shares != profile.breakdown.shares:
        profile = replace(profile, breakdown=replace(profile.breakdown, shares=shares))
    idle, gpu_signals = job_gpu_idle(stats)
    cp_shares = dict(shares)
    link = link_bound(stats, th)
    if link > cp_shares.get("h2d_copy", 0.0):
        cp_shares["h2d_copy"] = link  # copies over a saturated link: the GPU waits on them
    cp = critical_path(
        cp_shares,
        idle,
        metrics.get("syncs_per_step"),
        gpu_signals + (("stacks",) if profile.samples else ()),
        has_stacks=profile.samples > 0,
    )
    caused = (lambda c: None) if idle is None else cp.caused
    findings: list[Finding] = []
    findings += data_findings(profile, metrics, th, caused("data_wait"), idle)
    findings += sync_findings(metrics, sync_sites(view), th, cp)
    findings += io_findings(profile, metrics, th, loader_d, caused("storage_io"))
    findings += gil_findings(profile, th, caused("gil_wait"), idle)
    findings += checkpoint_findings(
        view, profile, clf, th, caused("checkpoint"), gpu_compute(stats)
    )
    findings += host_findings(view, profile, clf, shares, cp, metrics, th)
    findings += host_contention_findings(view, profile, th)
    findings += gpu_findings(stats, findings, th, cp, metrics)
    for st in stats:
        metrics[f"gpu{st.index}_busy"] = st.busy
        metrics[f"gpu{st.index}_vram_peak_bytes"] = st.mem_peak
    metrics["gpus"] = float(len(stats))
    phases = phase_summary(tl, win, clf) if tl is not None else {}
    findings += startup_findings(phases, th)
    findings = [with_gpu_idle(f, cp) for f in findings]
    findings = ranked(findings)
    chosen = resolve_price(stats, price, price_table or {})
    cost, findings = cost_analysis(
        stats,
        findings,
        metrics,
        checkpoints_seen(findings, profile.share("checkpoint")),
        chosen,
        th,
    )
    findings = ranked(findings)
    return Analysis(
        profile.breakdown,
        tuple(findings),
        metrics,
        profile,
        cost,
        phases,
        cp,
        verdict_of(findings, profile.samples, metrics.get("steps"), th, unjudged(profile, th)),
    )


def unjudged(profile, th: Thresholds) -> tuple[str, ...]:
    """The checks that rest on the loop's stack samples and did not have enough of them."""
    if profile.samples >= th.min_loop_samples:
        return ()
    out = ["checkpoint", "storage", "host-bound"]
    if not gil_judged(profile, th):
        out.append("GIL")
    return tuple(out)


def verdict_of(
    findings: list[Finding],
    samples: float,
    steps: float | None,
    th: Thresholds,
    not_judged: tuple[str, ...] = (),
) -> dict:
    """How sure the top verdict is, from the samples it rests on.

    `not_judged`: checks that lacked their evidence; with none of the others crossing its
    threshold the verdict names them and is not sure (timed steps judge the data wait only).
    """
    top = next((f for f in findings if f.severity in ("error", "warning")), None)
    enough = samples >= th.min_loop_samples or (steps or 0) >= 10  # hooks time every step
    # GIL001 rests on schedstat and --gil ticks (judged when "GIL" is not in not_judged)
    enough = enough or (top is not None and top.id == "GIL001" and "GIL" not in not_judged)
    basis = f"{samples:.0f} loop stack samples" + (f", {steps:.0f} timed steps" if steps else "")
    if not enough:
        return {
            "finding": top.id if top else None,
            "sure": False,
            "confidence": round(top.confidence, 3) if top else None,
            "statement": f"not sure yet: {basis}, {th.min_loop_samples} samples needed; "
            "profile longer (--duration)",
        }
    if top is None and not_judged:
        return {
            "finding": None,
            "sure": False,
            "confidence": None,
            "statement": f"no bottleneck crossed its threshold in the checks that had their "
            f"evidence ({basis}); not judged: {', '.join(not_judged)} "
            f"({th.min_loop_samples} loop stack samples needed); profile longer (--duration)",
        }
    if top is None:
        return {
            "finding": None,
            "sure": True,
            "confidence": None,
            "statement": f"no bottleneck crossed its threshold ({basis})",
        }
    sure = top.confidence >= th.sure_confidence
    return {
        "finding": top.id,
        "sure": sure,
        "confidence": round(top.confidence, 3),
        "statement": f"{top.id} with {top.confidence:.0%} confidence ({basis})"
        + ("" if sure else "; not sure: profile longer (--duration) to settle it"),
    }


def startup_findings(phases: dict, th: Thresholds) -> list[Finding]:
    """START001 (a note) when start-up is a large share of the run."""
    share = phases.get("startup_share") or 0.0
    if not phases:
        return []
    if (
        share < th.startup_note
        or phases.get("startup_s", 0.0) < th.startup_note_min_s
        or phases.get("source") == "whole run"
    ):
        return []
    top = phases.get("startup_top") or []
    where = "; ".join(f"{t['where']} {t['share']:.0%}" for t in top)
    msg = (
        f"The job spent {phases['startup_s']:.1f} s before its first step, {share:.0%} of "
        f"the {phases['startup_s'] + phases['loop_s'] + phases['shutdown_s']:.0f} s run"
        + (f" (start-up samples: {where})" if where else "")
        + ". The findings above cover "
        "the loop only; for a short job, start-up is a cost of its own."
    )
    ev = (
        Evidence(
            "startup_share",
            round(share, 4),
            "ratio",
            th.startup_note,
            ">=",
            "startup_note",
            "run window",
        ),
        Evidence("startup_s", phases["startup_s"], "s", source=phases.get("source")),
    )
    actions = (
        "run more steps per job so start-up is amortised (one job instead of many short ones)",
        "defer heavy imports; load data and build the model once",
        "cache compiled artefacts (TORCHINDUCTOR_CACHE_DIR) when using torch.compile",
    )
    return [
        Finding(
            id="START001",
            title=spec("START001").title,
            severity=severity("START001", 0.0, th),
            confidence=0.9,
            impact=0.0,
            message=msg,
            evidence=ev,
            recommendation=Recommendation("Amortise start-up over more work", actions),
            expected_speedup=1.0,
            signals=("run window",),
            speedup_basis="not a loop speed-up: start-up time is outside the loop",
        )
    ]


def with_gpu_idle(f: Finding, cp: CriticalPath) -> Finding:
    """A host-side cause states the GPU idle it accounts for, when there is a GPU signal."""
    if (
        cp.gpu_idle is None
        or category(f.id) != "host"
        or not explains_gpu_idle(f.id)
        or "GPU idles" in f.message
    ):
        return f
    return replace(
        f,
        message=f"{f.message} The GPU sat idle {cp.gpu_idle:.0%} of the loop; "
        f"this cause accounts for about {f.impact:.0%} of it.",
        evidence=f.evidence
        + (Evidence("gpu_idle_share", round(cp.gpu_idle, 4), "ratio", source="nvml utilization"),),
        signals=tuple(dict.fromkeys(f.signals + ("nvml utilization",))),
    )
