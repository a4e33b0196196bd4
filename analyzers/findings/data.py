"""Input-pipeline findings: DATA001 (the loop waits for batches), DATA002 (the job's own
workers already fill the physical cores), DATA003 (workers re-created every epoch: in
worker_churn). IO001 (storage) is in analyzers.storage."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.findings.loaders import (
    WaitingLoaders,
    loader_on_cpu,
    waiting_loaders_finding,
)
from gpudiag.analyzers.findings.worker_churn import DATA003, churn_findings, data_wait_spec
from gpudiag.analyzers.measures.loop import LoopProfile, location_of
from gpudiag.analyzers.measures.rules import user_location
from gpudiag.analyzers.measures.summary import SAMPLE_CORRELATION, confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Measured, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.model.thresholds import Thresholds

DATA001 = register(
    data_wait_spec(
        "DATA001",
        "Loop waits on the input pipeline (the DataLoader)",
        Doc(
            means=(
                "the loop waits on the DataLoader (one id for the cause, whatever the box's idle "
                "cores)"
            ),
            fix=(
                "graded by the evidence it shows (idle cores, physical cores, workers running, "
                "the loaders' off-CPU share from schedstat): loaders that wait (off-CPU >= "
                "`loader_wait_min`: sleeps, network, object store; with `num_workers=0` also at "
                "least `loader_blocking_min` of the sampled loading lines on such a call, since "
                "the loop thread is also off-CPU while native threads, a fast tokenizer's or the "
                "intra-op pool, do its loading) get `num_workers=N` to overlap the waits even on "
                "a busy box; loaders that compute get `num_workers=N` from the loading/compute "
                'ratio and the idle cores, or, with fewer than `min_free_cores` idle, "make '
                'loading cheaper; num_workers=N helps once cores are free"'
            ),
            measured=(
                Measured(
                    impact="GPU idle while the loop waits for batches "
                    "(without a GPU: the wait share)",
                    speedup=(
                        "step after = max(rest of the step, loading / loaders), loaders = "
                        "min(workers, physical cores - 1: SMT siblings add little to decoding; 2 "
                        "logical CPUs per core assumed when psutil cannot tell)"
                    ),
                    checked="x7.5 / x7.5-7.6",
                ),
                Measured(
                    impact="as DATA001",
                    speedup=(
                        "step after = max(rest of the step, loading / N loaders), loaders not "
                        "limited by cores (a waiting loader needs little CPU)"
                    ),
                    variant="DATA001 (waiting loaders)",
                ),
                Measured(
                    impact="as DATA001",
                    speedup="a bound: the wait removed",
                    variant="DATA001 (computing loaders, no idle cores) and DATA002",
                ),
            ),
        ),
    )
)

DATA002 = register(
    data_wait_spec(
        "DATA002",
        "Input pipeline is CPU-bound and the cores are already busy",
        Doc(
            means=(
                "the loop waits on the DataLoader and the job's own workers already fill the "
                "physical cores with CPU work (a fact of the job, not of the box)"
            ),
            fix=(
                "cheaper transforms (names the hot function), pre-processed/cached data, GPU "
                "decoding; fewer workers if oversubscribed"
            ),
            measured=(
                Measured(
                    impact="as DATA001",
                    speedup="a bound: the wait removed",
                    variant="DATA001 (computing loaders, no idle cores) and DATA002",
                ),
            ),
        ),
    )
)


STACKS = "stacks"


def hot_loader_function(profile: LoopProfile) -> str | None:
    """'function (file:line)' where the loaders spend most of their busy time, user code first."""
    if profile.loader is None:
        return None
    for s in profile.loader.top_stacks:
        fr = user_location(s.stack)
        if fr is not None:
            return f"{fr.function} ({fr.file}:{fr.line})"
    return None


@dataclass(frozen=True)
class WorkerPlan:
    """What more DataLoader workers would do, from a model of the loaders and the cores."""

    need: int  # workers that would make loading keep up with the rest of the step
    suggest: int  # workers to set, given the cores there are
    speedup: float  # the loop's rate after the change, over its rate now
    loader_cores: int  # physical cores the loaders can use (the loop keeps one)
    physical: int  # physical cores of the host (measured, or assumed: see smt_assumed)
    smt_assumed: bool


def loader_cores(cpu_count: int, physical: float | None) -> tuple[int, int, bool]:
    """(physical cores left to loaders, physical cores, whether SMT was assumed)."""
    assumed = physical is None
    phys = int(physical) if physical else (cpu_count // 2 if cpu_count >= 4 else cpu_count)
    return max(1, phys - 1), max(1, phys), assumed


def suggest_workers(
    wait: float, workers: int, free_cores: float, cpu_count: int, physical: float | None = None
) -> WorkerPlan:
    """Workers needed and advised for a loop that waits `wait` of its step on loading.

    Model (a step normalised to 1): the rest of the step takes R = 1 - wait. Loading runs in
    parallel on at most `loader_cores` physical cores (SMT siblings add little to decoding).
    With num_workers=0 the loop thread loads a batch in `wait`; with W workers the loaders'
    rate is what paces the loop now. With W' workers the step takes
    max(R, load / min(W', loader_cores)): the loader rate, capped by the rest of the step.
    """
    rest = max(1e-3, 1.0 - wait)
    cores, phys, assumed = loader_cores(cpu_count, physical)

    def eff(n: int) -> float:
        return float(min(n, cores)) if n > 0 else 1.0

    # loading work per batch, in one-core units: the loop's own time, or workers' pace
    load = wait if workers == 0 else eff(workers) * 1.0
    cap = max(1, cpu_count - 1) if workers == 0 else max(workers, cpu_count)
    cap = min(cap, workers + max(1, int(round(free_cores))))  # the cores really idle
    # workers that would keep up given enough cores (one core each)
    need = max(workers + 1, math.ceil(load / rest - 1e-9))
    suggest = max(min(need, cap), 0)
    # the step now is 1 (normalised); after, the slower of the loaders and the rest
    after = max(rest, load / eff(suggest)) if suggest > workers else 1.0
    return WorkerPlan(need, suggest, 1.0 / after, cores, phys, assumed)


@dataclass(frozen=True)
class Wait:
    """The loop's wait for batches: its share, how sure, what measured it, its impact (the
    GPU idle it causes where there is a GPU signal, else the share)."""

    share: float
    conf: float
    source: str
    impact: float


def measured_wait(
    profile: LoopProfile, metrics: dict, th: Thresholds, gpu_idle_caused: float | None
) -> Wait | None:
    """The wait for batches when it crosses data_wait_warn surely, else None."""
    wait = profile.share("data_wait")
    n = profile.samples
    exact = metrics.get("data_wait_ratio")
    if exact is not None and metrics.get("steps", 0) >= 10:
        # the hooks time every DataLoader wait: use that, minus the storage share the
        # stacks attribute to reads (IO001 reports that part)
        sampled = wait + profile.share("storage_io")
        wait = exact * (wait / sampled) if sampled > 0 else exact
        # every timed step is an exact measurement of its own wait, not a correlated sample
        steps = metrics.get("steps", 0)
        conf = confidence_above(wait, th.data_wait_warn, max(n, steps * SAMPLE_CORRELATION))
        source = "in-process hooks"
    else:
        if n < th.stack_floor_samples:
            return None
        conf = confidence_above(wait, th.data_wait_warn, n)
        source = STACKS
    if wait < th.data_wait_warn or conf < th.min_confidence:
        return None
    impact = wait if gpu_idle_caused is None else gpu_idle_caused
    if impact < th.data_wait_warn:
        return None
    return Wait(wait, conf, source, impact)


@dataclass(frozen=True)
class Loading:
    """The input pipeline and the box it runs on, as DATA001/DATA002 reason about them."""

    cpu_count: int
    free: float | None
    util: float | None
    workers: int
    plan: WorkerPlan  # more workers, on the idle cores
    full: WorkerPlan  # more workers, on every core
    floor: float | None  # the GPU's busy time caps any speed-up
    on_cpu: float | None
    blocking: float
    hot: str | None

    @property
    def cores_txt(self) -> str:
        return f"{self.plan.physical} physical cores" + (
            " (assumed: 2 logical CPUs per core)" if self.plan.smt_assumed else ""
        )

    @property
    def fills_cores(self) -> bool:
        """The job's own workers already fill the cores loading can use (DATA002)."""
        return self.workers > 0 and (self.full.suggest <= self.workers or self.full.speedup < 1.05)

    @property
    def where(self) -> str:
        return f" Loaders spend most time in {self.hot}." if self.hot else ""


def loading_of(profile: LoopProfile, metrics: dict, wait: float, gpu_idle: float | None) -> Loading:
    """The loaders, the cores and the worker plans for a wait of `wait`."""
    cpu_count = int(metrics.get("cpu_count") or 1)
    free = metrics.get("host_free_cores")
    workers = (
        int(round(metrics.get("workers") or 0))
        if profile.loader and profile.loader.source == "workers"
        else 0
    )
    physical = metrics.get("cpu_physical")
    plan = suggest_workers(
        wait, workers, free if free is not None else cpu_count - 1, cpu_count, physical
    )
    # the job's own workers fill the physical cores with CPU work: a fact of the job, not of
    # how busy the box was when we looked (that only grades DATA001's advice)
    full = suggest_workers(wait, workers, cpu_count, cpu_count, physical)
    return Loading(
        cpu_count,
        free,
        metrics.get("host_cpu_util"),
        workers,
        plan,
        full,
        speedup_from_impact(gpu_idle) if gpu_idle is not None else None,
        loader_on_cpu(profile, metrics, workers),
        profile.loader.blocking_fraction if profile.loader else 0.0,
        hot_loader_function(profile),
    )


def _evidence(
    w: Wait, ld: Loading, th: Thresholds, gpu_idle_caused: float | None
) -> list[Evidence]:
    ev = [
        th.evidence(
            "data_wait_warn", "data_wait_share", round(w.share, 4), "ratio", ">=", w.source
        ),
        Evidence("dataloader_workers", float(ld.workers), "count", source="procfs"),
    ]
    if ld.free is not None:
        ev.append(
            th.evidence(
                "min_free_cores",
                "host_free_cores",
                round(ld.free, 2),
                "cores",
                ">=" if ld.free >= th.min_free_cores else "<",
                "procfs",
            )
        )
    if ld.util is not None:
        ev.append(Evidence("host_cpu_util", round(ld.util, 4), "ratio", source="procfs"))
    ev.append(
        Evidence(
            "physical_cores",
            float(ld.plan.physical),
            "cores",
            source="assumed: 2 logical CPUs per core" if ld.plan.smt_assumed else "psutil",
        )
    )
    if gpu_idle_caused is not None:
        ev.append(
            Evidence(
                "gpu_idle_caused",
                round(gpu_idle_caused, 4),
                "ratio",
                source="critical path (nvml + loop)",
            )
        )
    return ev + _loader_evidence(ld, th)


def _loader_evidence(ld: Loading, th: Thresholds) -> list[Evidence]:
    if ld.on_cpu is None:
        return []
    off = 1.0 - ld.on_cpu
    ev = [
        th.evidence(
            "loader_wait_min",
            "loader_off_cpu_share",
            round(off, 4),
            "ratio",
            ">=" if off >= th.loader_wait_min else "<",
            "procfs schedstat",
        )
    ]
    # With num_workers=0 the loop thread's off-CPU time while loading may be a wait on the
    # native threads doing the work (a fast tokenizer's pool, the intra-op pool): it is a wait
    # for I/O only when the loading lines py-spy sampled wait too (measured on the Trainer
    # script: off-CPU 48-60% while tokenising, and 2 workers gave x0.98).
    if ld.workers == 0:
        ev.append(
            th.evidence(
                "loader_blocking_min",
                "loader_blocking_call_share",
                round(ld.blocking, 4),
                "ratio",
                ">=" if ld.blocking >= th.loader_blocking_min else "<",
                "stacks",
            )
        )
    return ev


def _loader_bound(c: Context) -> list[Finding]:
    """DATA001 or DATA002 when the loop waits on CPU work in the input pipeline; its impact
    is the GPU idle the critical path puts on the wait (the loop's wait share without a GPU
    signal)."""
    profile, metrics, th = c.profile, c.metrics, c.th
    gpu_idle_caused = c.caused("data_wait")
    w = measured_wait(profile, metrics, th, gpu_idle_caused)
    if w is None:
        return []
    ld = loading_of(profile, metrics, w.share, c.idle)
    ev = _evidence(w, ld, th, gpu_idle_caused)
    loc = location_of(profile.stacks_by_category.get("data_wait", ()))
    waits = (
        ld.on_cpu is not None
        and 1.0 - ld.on_cpu >= th.loader_wait_min
        and (ld.workers > 0 or ld.blocking >= th.loader_blocking_min)
    )
    if waits:
        off = 1.0 - (ld.on_cpu or 0.0)
        seen = WaitingLoaders(w.share, ld.workers, off, ld.floor, w.conf, w.impact, ld.where)
        return [waiting_loaders_finding(seen, th, ev, loc)]
    no_room = ld.free is not None and ld.free < th.min_free_cores
    if ld.fills_cores or no_room:
        return [_crowded(w, ld, metrics, th, ev, loc)]
    return [_more_workers(w, ld, th, ev, loc)]


def _crowded_actions(ld: Loading, fill: bool) -> list[str]:
    actions = []
    if ld.hot:
        actions.append(
            f"make the per-sample work cheaper: profile {ld.hot} "
            "(decode at lower resolution, vectorise, drop redundant copies)"
        )
    actions += [
        "pre-process once and cache the decoded/augmented tensors (e.g. save to .npy or "
        "a WebDataset/LMDB shard) so each epoch only reads them",
        "move augmentation to the GPU (torchvision.transforms.v2 on CUDA tensors, "
        "NVIDIA DALI, torchvision.io.decode_jpeg(device='cuda'))",
    ]
    if ld.workers > ld.cpu_count:
        actions.append(
            f"num_workers={max(1, ld.cpu_count - 1)}: {ld.workers} workers on "
            f"{ld.cpu_count} cores oversubscribe the CPU"
        )
    if not fill and ld.full.suggest > ld.workers:
        actions.append(
            f"num_workers={ld.full.suggest} once the box has idle cores (stop the other "
            "work on it, or run on a machine with more CPU cores per GPU)"
        )
    else:
        actions.append("or run on a machine with more CPU cores per GPU")
    return actions


def _crowded(w: Wait, ld: Loading, metrics: dict, th: Thresholds, ev: list, loc: Any) -> Finding:
    """DATA002 (the job's own workers fill the cores) or DATA001 on a box with no idle core:
    more workers cannot help, or only once cores are free."""
    fill = ld.fills_cores
    if fill:
        why = (
            f"{ld.workers} workers already fill the {ld.full.loader_cores} of the "
            f"{ld.cores_txt} that loading can use (the loop keeps one)"
        )
    else:
        used = (metrics.get("worker_cpu_cores") or 0.0) + (metrics.get("target_cpu_cores") or 0.0)
        why = (
            f"the loaders compute and the box has {ld.free or 0:.1f} of {ld.cpu_count} cores "
            f"idle ({ld.util or 0:.0%} busy; the job uses {used:.1f} cores, {ld.workers} "
            f"DataLoader workers)"
        )
    msg = (
        f"The loop waits for batches {w.share:.0%} of the time, but {why}. More workers "
        + ("would only compete for the same cores." if fill else "pay only once cores are free.")
        + ld.where
    )
    bound = speedup_from_impact(w.share)
    if ld.floor:
        bound = min(bound, ld.floor)
    summary = (
        "Make loading cheaper; more workers cannot help here"
        if fill
        else f"Make loading cheaper; num_workers={ld.full.suggest} helps once cores are free"
    )
    return new_finding(
        "DATA002" if fill else "DATA001",
        th,
        confidence=w.conf,
        impact=w.impact,
        message=msg,
        evidence=tuple(ev),
        recommendation=Recommendation(summary, tuple(_crowded_actions(ld, fill))),
        expected_speedup=bound,
        location=loc,
        signals=("stacks", "procfs"),
        speedup_basis=f"a bound: x{bound:.2f} if loading cost nothing (the wait removed"
        + (", capped by the GPU's busy time)" if ld.floor else ")"),
        speedup_kind="bound",
        fix=None if fill else candidate_fix(ld.full.suggest, ld.workers),
    )


def _more_workers(w: Wait, ld: Loading, th: Thresholds, ev: list, loc: Any) -> Finding:
    """DATA001 with idle cores: the workers that keep up, and the speed-up they give."""
    plan = ld.plan
    idle = (
        f"{ld.free:.1f} of {ld.cpu_count} CPU cores are idle"
        if ld.free is not None
        else "host CPU use was not measured"
    )
    msg = (
        f"The loop waits for batches {w.share:.0%} of the time "
        f"(num_workers={ld.workers}); {idle}."
        f"{ld.where} Loading needs about {plan.need} worker{'s' if plan.need != 1 else ''} to "
        f"keep up" + (f"; {plan.suggest} fit the idle cores." if plan.suggest < plan.need else ".")
    )
    actions = [f"DataLoader(..., num_workers={plan.suggest})"]
    if plan.suggest < plan.need:
        actions.append(
            f"{plan.need} workers would hide loading entirely; with more cores "
            f"(or cheaper transforms) set num_workers={plan.need}"
        )
    actions.append("persistent_workers=True (keep workers alive between epochs)")
    if ld.workers > 0:
        actions.append("prefetch_factor=4 (more batches queued per worker, smooths bursts)")
    speedup = min(plan.speedup, ld.floor) if ld.floor else plan.speedup
    basis = (
        f"loader rate with {plan.suggest} workers on at most {plan.loader_cores} of "
        f"{ld.cores_txt} against the rate the rest of the step allows "
        f"({1 - w.share:.0%} of it)"
        + ("; capped by the GPU's busy time" if ld.floor and plan.speedup > ld.floor else "")
    )
    return new_finding(
        "DATA001",
        th,
        confidence=w.conf,
        impact=w.impact,
        message=msg,
        evidence=tuple(ev),
        recommendation=Recommendation(
            f"Load batches in parallel: num_workers={plan.suggest}", tuple(actions)
        ),
        expected_speedup=speedup,
        location=loc,
        signals=("stacks", "procfs"),
        speedup_basis=basis,
        fix={
            "kind": "dataloader",
            "values": {"num_workers": plan.suggest, "persistent_workers": True},
        },
    )


def candidate_fix(suggest: int, workers: int) -> dict | None:
    """More workers as a fix to measure, not to promise: on a box with no idle core the model
    cannot tell whether a worker pays (x0.98 for one public script, x1.16 for the demo)."""
    if suggest <= workers:
        return None
    return {
        "kind": "dataloader",
        "values": {"num_workers": suggest, "persistent_workers": True},
        "candidate": "the box has no idle core: whether more workers pay is measured, not modelled",
    }


CROWDED_NOTE = (
    " The job's own threads crowd its cores (HOST003): the loaders run slower for it. Size "
    "the thread pools first; the wait left is measured again after."
)


def behind_own_threads(f: Finding) -> Finding:
    """A CPU-bound input pipeline's finding made where the job's own threads oversubscribe its
    cores (HOST003): a note after HOST003, whose fix moves the loaders too (torch.set_num_threads
    (16) and 4 threads per worker on 2 cores: the loop waited 27-29% for batches, HOST003's
    thread counts moved the job x1.76-1.99)."""
    if f.id not in (DATA001.id, DATA002.id):
        return f
    return replace(f, severity="note", message=f.message + CROWDED_NOTE)


def find(c: Context) -> list[Finding]:
    """DATA003 when the wait is for workers started again every epoch, else DATA001 or
    DATA002, from the analysis context (a note beside HOST003)."""
    found = churn_findings(c) or _loader_bound(c)
    if c.claimed("own_threads"):
        return [behind_own_threads(f) for f in found]
    return found


FINDER = Finder("data", find, (DATA001, DATA002, DATA003))
