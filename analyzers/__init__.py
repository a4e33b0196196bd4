"""Analyzers: pure functions from a timeline and thresholds to a time breakdown and findings."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudiag.analyzers.checkpoint import checkpoint_findings
from gpudiag.analyzers.cost import checkpoints_seen, cost_analysis, resolve_price
from gpudiag.analyzers.gil import gil_findings
from gpudiag.analyzers.gpu import gpu_findings, with_gpu_idle
from gpudiag.analyzers.loop import LoopProfile, profile_loop, thread_series_mean
from gpudiag.analyzers.metrics import host_metrics
from gpudiag.analyzers.pipeline import data_findings, io_findings
from gpudiag.analyzers.prices import Price
from gpudiag.analyzers.results import Breakdown, Finding
from gpudiag.analyzers.rules import Classifier, Rule
from gpudiag.analyzers.sync import sync_findings
from gpudiag.analyzers.thresholds import Thresholds
from gpudiag.analyzers.throughput import sync_sites, throughput_metrics
from gpudiag.analyzers.timeline import Timeline

__all__ = ["Analysis", "analyze", "Thresholds", "Timeline", "Rule", "Finding", "Breakdown"]


@dataclass(frozen=True)
class Analysis:
    """The result of analysing a timeline."""

    breakdown: Breakdown
    findings: tuple[Finding, ...]
    metrics: dict[str, float | None]
    profile: LoopProfile
    cost: dict = field(default_factory=dict)


def analyze(tl: Timeline, thresholds: Thresholds | None = None,
            rules: tuple[Rule, ...] = (), price: Price | None = None,
            price_table: dict[str, float] | None = None) -> Analysis:
    """Breakdown, findings (sorted by impact, largest first) and costs for a timeline.

    `price` overrides the GPU-hour price; `price_table` maps model keys or GPU names (or
    "default") to prices; otherwise the built-in reference table is used.
    """
    th = thresholds or Thresholds()
    clf = Classifier(rules)
    profile = profile_loop(tl, clf)
    metrics = host_metrics(tl)
    metrics.update(throughput_metrics(tl))
    metrics["stack_samples"] = profile.samples
    metrics["startup_samples"] = profile.startup_samples
    if profile.thread is not None:
        metrics["loop_thread_cpu"] = profile.loop_cpu
        metrics["loop_thread_d_state"] = thread_series_mean(tl, "d_state", profile.thread.tid)
    loader_d = None
    if profile.loader is not None:
        loader_d = metrics.get("worker_d_state_share") if profile.loader.source == "workers" \
            else metrics.get("loop_thread_d_state")
    findings: list[Finding] = []
    findings += data_findings(profile, metrics, th)
    findings += sync_findings(metrics, sync_sites(tl), th)
    findings += io_findings(profile, metrics, th, loader_d)
    findings += gil_findings(profile, th)
    findings += checkpoint_findings(tl, profile, clf, th)
    gpu, stats = gpu_findings(tl, findings, th, profile.share("h2d_copy"))
    findings = with_gpu_idle(findings, stats) + gpu
    for st in stats:
        metrics[f"gpu{st.index}_busy"] = st.busy
        metrics[f"gpu{st.index}_vram_peak_bytes"] = st.mem_peak
    metrics["gpus"] = float(len(stats))
    findings.sort(key=lambda f: (-f.impact, f.id))
    chosen = resolve_price(stats, price, price_table or {})
    cost, findings = cost_analysis(stats, findings, metrics,
                                   checkpoints_seen(findings, profile.share("checkpoint")),
                                   chosen, th)
    findings.sort(key=lambda f: (-f.impact, f.id))
    return Analysis(profile.breakdown, tuple(findings), metrics, profile, cost)
