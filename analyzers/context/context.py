"""The analysis context: what every finder reads, built once per analysed span of a run."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpudiag.analyzers.cost.prices import Price, identify
from gpudiag.analyzers.cost.projection import Prices, host_cause, project, resolve_price
from gpudiag.analyzers.measures.compute import (
    LOW_PRECISION,
    Attainable,
    ComputeTable,
    Datasheet,
    compute_table,
)
from gpudiag.analyzers.measures.critical_path import CriticalPath, critical_path, refine_with_hooks
from gpudiag.analyzers.measures.gpu_stats import GpuStats, gpu_stats, job_gpu_idle, link_bound
from gpudiag.analyzers.measures.loop import LoopProfile, profile_loop, thread_series_mean
from gpudiag.analyzers.measures.module_split import ComputeSplit, call_sources, compute_split
from gpudiag.analyzers.measures.rules import NO_TRAINING_RULES, Classifier
from gpudiag.analyzers.measures.serving import (
    POOLED_TID,
    HandlerSplit,
    handler_split,
    model_metrics,
    padding_metrics,
    pool_handlers,
    serving_metrics,
)
from gpudiag.analyzers.measures.summary import host_metrics
from gpudiag.analyzers.measures.throughput import throughput_metrics
from gpudiag.analyzers.measures.window import LoopWindow, loads_in_loop, phase_summary
from gpudiag.analyzers.measures.workload import Workload, decide_workload
from gpudiag.analyzers.model.catalogue import spec
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Aggregate, Timeline


@dataclass(frozen=True)
class Context:
    """One span of a run, analysed once: the loop's profile and shares, the GPUs' stats, the
    critical path, the metrics and the thresholds. Finders read it; none re-derives it."""

    view: Aggregate  # the span's samples (the loop window, or a period of it)
    win: LoopWindow
    th: Thresholds
    clf: Classifier
    stats: tuple[GpuStats, ...]  # GPUs with samples
    profile: LoopProfile
    metrics: dict  # host and throughput metrics (the analysis adds the GPUs' after finding)
    shares: dict[str, float]  # the breakdown's shares, refined by the hooks' timings
    cp: CriticalPath
    idle: float | None  # the job's GPU idle share; None without a GPU signal
    loader_d: float | None  # the loaders' D-state share (workers', or the loop thread's)
    phases: dict  # start-up, loop and shutdown (empty for a period)
    found: tuple = ()  # the findings the finders registered before this one made
    workload: Workload | None = None  # training, inference or server (measures/workload.py)
    right_size: dict = field(default_factory=dict)  # the model of the job on other GPUs
    price: Price | None = None  # the GPU-hour price this run is priced at (None: not known)
    handlers: HandlerSplit | None = None  # a server's request path split once (SERVE002/005)
    compute: ComputeTable | None = None  # the hooks' sampled steps by module (COMP001)
    split: ComputeSplit | None = None  # the model's time by call site from the stacks, when
    # no hook timed the modules (plain attach)

    def caused(self, category: str) -> float | None:
        """The GPU idle the critical path puts on one breakdown category (None without a
        GPU signal: the finders then use the loop's share)."""
        return None if self.idle is None else self.cp.caused(category)

    def claiming(self, claim: str) -> tuple:
        """The findings made before this finder that claim a part of the loop (their specs'
        `claims`, e.g. "eval_pass"): how a finder defers to another without naming its id."""
        return tuple(f for f in self.found if claim in spec(f.id).claimed)

    def claimed(self, claim: str) -> bool:
        """Whether a finding made before this finder claims this part of the loop."""
        return bool(self.claiming(claim))


def model_reloaded(
    tl: Timeline | Aggregate, win: LoopWindow, clf: Classifier, th: Thresholds
) -> bool:
    """Whether the job loads its model again and again inside its loop: the hooks see most
    forwards run by a model never seen before, or the stacks see loading in most of the
    loop's stack windows (a state dict put into the same model again shows only there)."""
    whole = tl.whole() if isinstance(tl, Timeline) else tl
    new = model_metrics(whole).get("models_new_share")
    if new is not None and new >= th.serve_new_model_share:
        return True
    return loads_in_loop(tl, win, clf)


def _profile(
    view: Aggregate,
    clf: Classifier,
    workload: Workload,
    uses_gpu: bool,
    th: Thresholds,
    reloads: bool = False,
) -> LoopProfile:
    """The loop's profile; a server's from its request-handler threads pooled (each request
    has its own short-lived thread: no one of them is the loop). `reloads`: the job loads its
    model inside its loop (`model_reloaded`)."""
    pooled = pool_handlers(view) if workload.kind == "server" else None
    if workload.kind in ("server", "inference"):
        clf = Classifier(clf.user_rules + NO_TRAINING_RULES)
    serving = workload.kind == "server"
    profile = profile_loop(
        pooled or view,
        clf,
        backward_elsewhere=uses_gpu,
        gil_other_min=th.gil_other_min,
        idle_waits=serving,
        loads_in_loop=reloads,
    )
    if pooled is None or profile.thread is None or profile.thread.tid != POOLED_TID:
        return profile
    basis = f"py-spy stack samples of the job's {profile.thread.thread}, pooled"
    return replace(profile, breakdown=replace(profile.breakdown, basis=basis))


def build_context(
    tl: Timeline | Aggregate | None,
    view: Aggregate,
    win: LoopWindow,
    th: Thresholds,
    clf: Classifier,
    prices: Prices | None = None,
) -> Context:
    """The context of `view`; `tl` is the whole run (None for a period: no phases, and the
    step rows are read from the view). `prices`: the user's price and price table, which
    the right-size projection uses."""
    stats = tuple(s for s in gpu_stats(view) if s.samples > 0)
    uses_gpu = any(s.job_uses_gpu for s in stats)
    whole = tl.whole() if isinstance(tl, Timeline) else view
    # step rows only exist inside the loop: read them over the whole run, so no step at the
    # window's edges is lost
    steps = throughput_metrics(whole)
    workload = decide_workload(whole, steps.get("steps") or 0.0)
    profile = _profile(view, clf, workload, uses_gpu, th, bool(win.reloads))
    metrics = host_metrics(view)
    metrics.update(steps)
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
    idle, gpu_signals = job_gpu_idle(list(stats))
    cp_shares = dict(shares)
    link = link_bound(list(stats), th)
    if link > cp_shares.get("h2d_copy", 0.0):
        cp_shares["h2d_copy"] = link  # copies over a saturated link: the GPU waits on them
    cp = critical_path(
        cp_shares,
        idle,
        metrics.get("syncs_per_step"),
        gpu_signals + (("stacks",) if profile.samples else ()),
        has_stacks=profile.samples > 0,
    )
    phases = phase_summary(tl, win, clf) if tl is not None else {}
    if workload.kind != "training":  # a training job's report keeps its metrics
        metrics.update(serving_metrics(whole))
    else:  # its forwards' attention masks, sampled by the hooks (gpudiag_serve.watch_masks)
        metrics.update(padding_metrics(whole))
    c = Context(view, win, th, clf, stats, profile, metrics, shares, cp, idle, loader_d, phases)
    given = prices or Prices()
    chosen = Prices(resolve_price(list(stats), given.current, given.table), given.table)
    right = project(list(stats), metrics, workload.kind, chosen, host_cause(cp))
    handlers = handler_split(view, clf) if workload.kind == "server" else None
    names = tuple(s.name for s in stats if s.job_uses_gpu)
    sheet = datasheet(names) if names else None
    table = compute_table(view, sheet, whole) if workload.kind == "training" else None
    split = (
        compute_split(view, profile, clf, bool(names), call_sources(whole))
        if workload.kind == "training" and table is None
        else None
    )
    return replace(
        c, workload=workload, right_size=right, handlers=handlers, compute=table, split=split
    )


def datasheet(gpu_names: tuple[str, ...]) -> Datasheet:
    """The job's GPU's datasheet rates by dtype (bf16/fp16 or TF32/fp32 peak, memory
    bandwidth), from the first of its GPUs the table knows; None where it knows none."""

    def rates(dtype: str) -> Attainable | None:
        for name in gpu_names:
            model = identify(name)
            if model is None:
                continue
            tflops = model.bf16_tflops if dtype in LOW_PRECISION else model.fp32_tflops
            label = f"datasheet {model.label} ({dtype})"
            return Attainable(tflops * 1e12, model.hbm_gb_s * 1e9, dtype, label)
        return None

    return rates
