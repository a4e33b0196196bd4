"""HOST001: the loop thread's own CPU work is the critical path.

With a GPU, the GPU idles while the loop thread runs on the CPU: kernel launches and Python
overhead (a per-parameter optimizer, many small ops, tiny batches) or the user's own code in
the loop (pre-processing each batch, tokenizing). Without a GPU signal, only the second is a
finding: a loop whose time is mostly in the user's own Python, which DataLoader workers
could overlap with the model's work.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.findings.data import loader_cores
from gpudiag.analyzers.measures.accounting import (
    Site,
    call_target,
    code_family,
    every_n,
    line_kind,
    loop_function,
)
from gpudiag.analyzers.measures.loop import LoopProfile
from gpudiag.analyzers.measures.rules import Classifier, parse_stack
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Location,
    Recommendation,
    speedup_from_impact,
    speedup_from_step,
)
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Aggregate

HOST001 = register(
    Spec(
        "HOST001",
        "Host-bound: the loop thread's CPU work is the critical path",
        "host",
        True,
        claims=("loop_time",),
        reads=("loop_host_time", "server_host_time", "inference_host_time"),
        doc=Doc(
            means=(
                "host-bound: the GPU idles while the loop thread works on the CPU (kernel "
                "launches, a per-parameter optimizer, your own per-batch code)"
            ),
            fix=(
                "names the phase: `fused=True`/`foreach=True`; torch.compile / CUDA graphs "
                '(`mode="reduce-overhead"`); bigger batch; input work of your own (tokenizing, '
                "transforms, reads) into DataLoader workers; your own per-step Python that is "
                "not input loading by what its lines do (incrementally, vectorised, built once, "
                "or every N steps), with the trial that measures it (`gpudiag try --fix "
                "thin:MODULE.FUNCTION:every=N`)"
            ),
            measured=(
                Measured(
                    impact="GPU idle while the loop thread works on the CPU",
                    speedup=(
                        "optimizer phase: its host time cut by 90% (per-parameter to fused) or "
                        "50% (foreach to fused), capped by the GPU's busy time; launch overhead: "
                        "a bound, the GPU's busy time per step; user code: spread over DataLoader"
                        " workers (input work), or a bound: its function's share removed (per-"
                        "step work that is not input loading)"
                    ),
                    checked="x1.9 / x1.9-2.0",
                ),
            ),
        ),
    )
)


# Share of the optimizer's host time a multi-tensor launch removes, by the kind now in use.
OPTIMIZER_CUT = {"per-parameter (foreach=False)": 0.9, "foreach": 0.5}


def _optimizer_kind(profile: LoopProfile) -> str | None:
    text = " ".join(s.stack for s in profile.stacks_by_category.get("optimizer", ()))
    if "_fused_" in text:
        return "fused"
    if "_multi_tensor_" in text:
        return "foreach"
    if "_single_tensor_" in text:
        return "per-parameter (foreach=False)"
    return None


def user_code_share(
    view: Aggregate, profile: LoopProfile, clf: Classifier
) -> tuple[float, Location | None]:
    """Share of loop samples whose innermost frame is the job's own code (not a library)."""
    if profile.thread is None or profile.samples <= 0:
        return 0.0, None
    n = 0.0
    by_site: dict[Location, float] = {}
    for (stack, code), c in view.stacks.get(profile.thread, {}).items():
        if clf.category(stack, code) != "other":
            continue
        frames = parse_stack(stack)
        inner = frames[-1] if frames else None
        if inner is None or not inner.is_user or inner.line <= 0:
            continue
        if code_family(code) is not None:  # a call the line makes (BLOCK001/LOOP001 name it)
            continue
        n += c
        loc = Location(inner.file, inner.line, inner.function)
        by_site[loc] = by_site.get(loc, 0.0) + c
    top = max(by_site, key=by_site.__getitem__) if by_site else None
    return n / profile.samples, top


@dataclass(frozen=True)
class OwnWork:
    """The job's own per-step Python at one function: its share of the loop, what its
    sampled lines do (the line kind with the most samples), and a line of it."""

    location: Location
    share: float
    kind: str
    code: str


def own_work(view: Aggregate, profile: LoopProfile, clf: Classifier, site: Location) -> OwnWork:
    """The function of `site` (the top line of the job's own code): its share and what its
    lines do (input when any line reads or prepares inputs, else the kind most sampled)."""
    kinds: dict[str, float] = {}
    codes: dict[str, float] = {}
    n = 0.0
    for (stack, code), c in view.stacks.get(profile.thread, {}).items() if profile.thread else ():
        if clf.category(stack, code) != "other":
            continue
        frames = parse_stack(stack)
        inner = frames[-1] if frames else None
        if inner is None or (inner.file, inner.function) != (site.file, site.function):
            continue
        if code_family(code) is not None:
            continue
        n += c
        kind = line_kind(code, site.function)
        kinds[kind] = kinds.get(kind, 0.0) + c
        codes[code.strip()] = codes.get(code.strip(), 0.0) + c
    share = n / profile.samples if profile.samples > 0 else 0.0
    named = {k: v for k, v in kinds.items() if k != "other"}
    kind = "input" if "input" in named else max(named, key=named.__getitem__, default="other")
    code = max(codes, key=codes.__getitem__, default="")
    return OwnWork(site, share, kind, code)


@dataclass(frozen=True)
class _Fix:
    """HOST001's words and model: the message, the change, its speed-up and how it was made."""

    message: str
    summary: str
    actions: tuple[str, ...]
    speedup: float
    kind: str  # "model" or "bound"
    basis: str


def host_findings(c: Context) -> list[Finding]:
    """HOST001 when host work is the critical path (with a GPU), or user code fills the loop."""
    profile, th = c.profile, c.th
    if profile.samples < th.stack_floor_samples:
        return []
    user, site = user_code_share(c.view, profile, c.clf)
    idle = c.cp.gpu_idle
    if idle is None:
        if user < th.host_user_code_warn:
            return []
        return [_user_code(c, user, site, None, user)]
    if c.cp.host_bound < th.host_bound_warn or profile.samples < th.min_loop_samples:
        return []
    impact = c.cp.host_bound
    if user >= th.host_user_code_warn and user > c.shares.get("optimizer", 0.0):
        return [_user_code(c, user, site, idle, impact)]
    return [_host_bound(c, idle, impact)]


def _host_bound(c: Context, idle: float, impact: float) -> Finding:
    """HOST001 for launch and Python overhead: the host is the critical path of a GPU loop."""
    fix = _host_fix(c, idle, impact)
    return new_finding(
        "HOST001",
        c.th,
        confidence=0.9,
        impact=impact,
        message=fix.message,
        evidence=_host_evidence(c, idle, impact),
        recommendation=Recommendation(fix.summary, fix.actions),
        expected_speedup=fix.speedup,
        location=None,
        signals=("nvml utilization", "stacks", "procfs"),
        speedup_basis=fix.basis,
        fix={"kind": "optimizer", "values": {"fused": True}}
        if fix.summary.startswith("Use a fused")
        else None,
        speedup_kind=fix.kind,
    )


def _host_evidence(c: Context, idle: float, impact: float) -> tuple[Evidence, ...]:
    th = c.th
    ev = [
        th.evidence(
            "host_bound_warn",
            "host_bound_gpu_idle",
            round(impact, 4),
            "ratio",
            ">=",
            "critical path (nvml + loop)",
        ),
        Evidence("gpu_idle_share", round(idle, 4), "ratio", source="nvml utilization"),
    ]
    loop_cpu = c.metrics.get("loop_thread_cpu")
    if loop_cpu is not None:
        ev.append(
            Evidence("loop_thread_cpu", round(loop_cpu, 4), "ratio", source="procfs schedstat")
        )
    for cat in ("forward", "backward", "optimizer"):
        ev.append(
            Evidence(
                f"loop_share[{cat}]", round(c.shares.get(cat, 0.0), 4), "ratio", source="stacks"
            )
        )
    return tuple(ev)


def _host_fix(c: Context, idle: float, impact: float) -> _Fix:
    """A fused optimizer when a per-parameter one takes its share, else fewer launches."""
    shares = c.shares
    opt = shares.get("optimizer", 0.0)
    kind = _optimizer_kind(c.profile)
    floor = speedup_from_impact(idle)  # the step cannot beat the GPU's busy time
    lead = (
        f"The GPU idles {idle:.0%} of the loop while the loop thread is busy on the "
        f"CPU: {impact:.0%} of the time the host is the critical path"
    )
    if kind in OPTIMIZER_CUT and opt >= c.th.host_optimizer_min:
        cut = OPTIMIZER_CUT[kind]
        return _Fix(
            f"{lead}. The optimizer takes {opt:.0%} of the loop, stepping {kind}: one small "
            "kernel per parameter and operation, each paying the launch cost.",
            "Use a fused (or foreach) optimizer, then compile the model",
            (
                "torch.optim.AdamW(..., fused=True) (or foreach=True where fused is not "
                "supported): one multi-tensor launch instead of one per parameter",
                "then, for the forward and backward launches: torch.compile(model), or "
                "CUDA graphs with torch.compile(model, mode='reduce-overhead')",
                "a larger batch does more work per launch (see MEM001 for the room there is)",
            ),
            min(floor, speedup_from_impact(cut * opt)),
            "model",
            f"the optimizer's host time ({opt:.0%} of the step) cut by {cut:.0%} with a "
            f"{'fused' if kind == 'foreach' else 'fused/foreach'} optimizer; capped by the "
            f"GPU's busy time (x{floor:.2f})",
        )
    phases = {p: shares.get(p, 0.0) for p in ("forward", "backward", "optimizer")}
    top = max(phases, key=phases.__getitem__)
    actions: tuple[str, ...] = (
        "CUDA graphs: torch.compile(model, mode='reduce-overhead') replays the "
        "step's kernels with one launch",
        "torch.compile(model) fuses small ops into fewer kernels",
        "a larger batch does more work per launch (see MEM001 for the room there is)",
    )
    if kind == "fused":
        actions += ("the optimizer is already fused",)
    return _Fix(
        f"{lead}, mostly in {top} ({phases[top]:.0%} of the loop): Python and kernel-launch "
        "overhead of many small operations.",
        "Cut launch overhead: CUDA graphs / torch.compile, bigger batches",
        actions,
        floor,
        "bound",
        f"a bound: x{floor:.2f} if launch overhead went away and the GPU's busy time set the step",
    )


def _user_code(
    c: Context, user: float, site: Location | None, idle: float | None, impact: float
) -> Finding:
    """HOST001 for the job's own Python in the loop: move it to workers, or make it cheaper."""
    th, samples = c.th, c.profile.samples
    work = own_work(c.view, c.profile, c.clf, site) if site is not None else None
    trial = None
    if work is not None and work.kind != "input" and work.share > 0:
        fix, trial = _per_step_fix(c, user, work, idle)
    else:
        fix = _user_code_fix(c.metrics, th, user, site, idle)
    return new_finding(
        "HOST001",
        th,
        # below min_loop_samples, how sure follows from the share against its threshold
        confidence=0.9
        if samples >= th.min_loop_samples
        else min(0.9, confidence_above(user, th.host_user_code_warn, samples)),
        impact=impact,
        message=fix.message,
        evidence=_user_code_evidence(c.metrics, th, user, idle),
        recommendation=Recommendation(fix.summary, fix.actions),
        expected_speedup=fix.speedup,
        location=site,
        signals=("stacks", "procfs"),
        speedup_basis=fix.basis,
        speedup_kind=fix.kind,
        fix=trial,
    )


# The fix of a line of per-step Python by what it does (not input: DataLoader workers would
# only move it): {name} the function, {n} every how many steps, {after} the share it keeps.
PER_STEP_ADVICE = {
    "recomputed": (
        "compute {name} incrementally: update a running total or count, or keep the window "
        "sorted (bisect.insort) and adjust it by the items that enter and leave, instead of "
        "reducing the whole collection again each step",
        "or compute it every {n} steps ({after}), when it is only read for logging",
    ),
    "loop": (
        "vectorise {name}: numpy/torch operations over the whole array instead of a Python "
        "loop per item",
        "or run it every {n} steps ({after})",
    ),
    "rebuilt": (
        "build what {name} rebuilds once, before the loop, and update it in place (a "
        "deepcopy or a new dict/list each step costs its whole size every step)",
        "or rebuild it every {n} steps ({after})",
    ),
    "other": ("run {name} every {n} steps ({after}), or compute it incrementally or vectorised",),
}


def _per_step_fix(
    c: Context, user: float, work: OwnWork, idle: float | None
) -> tuple[_Fix, dict | None]:
    """HOST001 on the job's own per-step Python that is not input loading (a metric over a
    window, a structure rebuilt each step): the fix follows from what its lines do, the bound
    from removing its share, and a thin trial of its function measures it."""
    loc, share = work.location, min(work.share, user)
    n = every_n(share, c.th.per_step_call_target)
    after = f"{share:.0%} of the loop -> {share / n:.1%}"
    loop = loop_function(c.view, c.profile, c.clf)
    target = call_target(Site(loc, work.code, "user", "", share, work.code), loop)
    trial = {"kind": "thin", "target": target, "values": {"every": n}} if target else None
    name = f"{loc.function} ({loc.file}:{loc.line})"
    actions = tuple(
        a.format(name=loc.function, n=n, after=after) for a in PER_STEP_ADVICE[work.kind]
    )
    if trial:
        actions += (
            f"measure it first: gpudiag try --fix thin:{target}:every={n} -- <the job> (the "
            f"fixed arm runs {target} every {n}th time; timed against the job as it is)",
        )
    removed = share if idle is None else min(share, idle)
    bound = speedup_from_impact(removed)
    what = {
        "recomputed": "reduces a whole collection again",
        "loop": "loops over items in Python",
        "rebuilt": "rebuilds a structure",
        "other": "runs",
    }[work.kind]
    msg = (
        f"The loop spends {user:.0%} of its time in the job's own Python, {share:.0%} in "
        f"{name}, which {what} every step (`{work.code[:80]}`): per-step work that is not "
        "the model and not input loading, so more DataLoader workers would not take it off "
        "the loop."
    )
    return (
        _Fix(
            msg,
            f"Do {loc.function}'s work less often or more cheaply",
            actions,
            bound,
            "bound",
            f"at most: {loc.function}'s share ({share:.0%}) removed from the loop"
            + ("; capped by the GPU's busy time" if idle is not None else "")
            + (f"; gpudiag try --fix thin:{target}:every={n} measures it" if trial else ""),
        ),
        trial,
    )


def _user_code_evidence(
    metrics: dict, th: Thresholds, user: float, idle: float | None
) -> tuple[Evidence, ...]:
    free = metrics.get("host_free_cores")
    ev = [
        th.evidence(
            "host_user_code_warn",
            "loop_share_in_user_code",
            round(user, 4),
            "ratio",
            ">=",
            "stacks",
        )
    ]
    if free is not None:
        ev.append(
            th.evidence(
                "min_free_cores",
                "host_free_cores",
                round(free, 2),
                "cores",
                ">=" if free >= th.min_free_cores else "<",
                "procfs",
            )
        )
    if idle is not None:
        ev.append(Evidence("gpu_idle_share", round(idle, 4), "ratio", source="nvml utilization"))
    return tuple(ev)


def _user_code_fix(
    metrics: dict, th: Thresholds, user: float, site: Location | None, idle: float | None
) -> _Fix:
    """Spread over workers when the box has idle cores; else a bound: make it cheaper."""
    cpu_count = int(metrics.get("cpu_count") or 1)
    cores, _phys, _assumed = loader_cores(cpu_count, metrics.get("cpu_physical"))
    free = metrics.get("host_free_cores")
    workers = max(1, min(cores, int(round(free)) if free is not None else cores))
    where = f"{site.function} ({site.file}:{site.line})" if site else "the job's own code"
    name = site.function if site else "this work"
    msg = (
        f"The loop spends {user:.0%} of its time in the job's own Python, most of it in "
        f"{where}, not in the model: per-batch work done inline holds the loop (and the "
        "GPU, when there is one) back."
    )
    if free is None or free >= th.min_free_cores:
        after = max(1.0 - user, user / workers)
        if idle is not None:
            after = max(after, 1.0 - idle)
        return _Fix(
            msg,
            f"Take {where} out of the loop thread",
            (
                f"move {name} into the Dataset's __getitem__ or a collate_fn and load with "
                f"DataLoader(..., num_workers={workers}), so it overlaps the model's work",
                "batch or vectorise it (one call per batch, numpy/torch ops instead of a "
                "Python loop per item)",
                "or cache its results when the same inputs repeat",
            ),
            speedup_from_step(after),
            "model",
            f"the user-code share ({user:.0%}) spread over {workers} worker"
            f"{'s' if workers != 1 else ''} and overlapped with the rest of the loop"
            + ("; capped by the GPU's busy time" if idle is not None else ""),
        )
    speed = speedup_from_impact(user)
    return _Fix(
        msg + f" The CPU has no idle core ({free:.1f} free), so make it cheaper.",
        f"Take {where} out of the loop thread",
        (
            f"batch or vectorise {name} (one call per batch, numpy/torch ops instead "
            "of a Python loop per item), or use a native implementation (e.g. a Rust "
            "'fast' tokenizer)",
            "cache its results when the same inputs repeat",
            "with idle cores, move it into DataLoader workers (Dataset.__getitem__ or collate_fn)",
        ),
        speed,
        "bound",
        f"a bound: x{speed:.2f} if {name} cost nothing (no idle core to move it to: "
        "make it cheaper)",
    )


def find(c: Context) -> list[Finding]:
    """HOST001, from the analysis context: not where a serving finder claims the workload's
    host time (one request or item per forward, the handlers' own work: HOST001 would name
    the same seconds again, as "the loop thread", in a job that has no training loop), and
    without the host time an evaluation pass or a debug switch claims."""
    kind = c.workload.kind if c.workload is not None else None
    if kind in ("server", "inference") and c.claimed(f"{kind}_host_time"):
        return []
    cp = c.cp
    for named in c.claiming("loop_host_time"):
        cp = replace(cp, host_bound=cp.host_bound * (1.0 - min(1.0, named.impact)))
    return host_findings(replace(c, cp=cp))


FINDER = Finder("host_bound", find, (HOST001,))
