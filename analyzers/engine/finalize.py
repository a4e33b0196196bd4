"""The one place findings are finished: each host-side cause states the GPU idle it
accounts for, the findings are ranked, priced (analyzers.cost) and ranked again, and the
verdict says how sure the top one is. `analyze`, the multi-rank session (which adds the DIST
findings) and `merge` all finish through here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.cost.money import Spend, checkpoints_seen, cost_analysis
from gpudiag.analyzers.cost.prices import Price
from gpudiag.analyzers.cost.projection import resolve_price
from gpudiag.analyzers.findings.gil import gil_judged
from gpudiag.analyzers.measures.accounting import waiting_share
from gpudiag.analyzers.measures.critical_path import CriticalPath
from gpudiag.analyzers.measures.serving import in_flight_by_kernel
from gpudiag.analyzers.measures.summary import straddles
from gpudiag.analyzers.model.catalogue import category, explains_gpu_idle, ranked, spec
from gpudiag.analyzers.model.results import Evidence, Finding
from gpudiag.analyzers.model.thresholds import Thresholds


@dataclass(frozen=True)
class Finished:
    """Findings ranked and priced, the money figures, and the verdict."""

    findings: tuple[Finding, ...]
    cost: dict
    verdict: dict


def finalize(
    found: list[Finding],
    c: Context,
    price: Price | None = None,
    price_table: dict[str, float] | None = None,
) -> Finished:
    """Rank, price and judge the findings of one context."""
    findings = ranked([with_gpu_idle(f, c.cp) for f in found])
    chosen = resolve_price(list(c.stats), price, price_table or {})
    spend = Spend(
        list(c.stats),
        c.metrics,
        chosen,
        checkpoints_seen(findings, c.profile.share("checkpoint")),
        right=c.right_size,
        workload_kind=c.workload.kind if c.workload else None,
        run_day=run_day(c.view.start_ns),
    )
    cost, findings = cost_analysis(spend, findings, c.th)
    findings = ranked(findings)
    kind = c.workload.kind if c.workload else None
    waits = waiting_share(c.view, c.profile, c.clf) if c.profile.samples else 0.0
    table = c.compute.to_dict() if c.compute is not None else None
    split = c.split.to_dict() if c.split is not None else None
    return Finished(
        tuple(findings),
        cost,
        judged(findings, c.profile, c.metrics, c.th, kind, waits, table, split),
    )


def judged(  # noqa: PLR0913 (the verdict's inputs)
    findings: list[Finding],
    profile: Any,
    metrics: dict,
    th: Thresholds,
    kind: str | None = None,
    waits: float = 0.0,
    compute: dict | None = None,
    split: dict | None = None,
) -> dict:
    """The verdict on ranked findings, from the loop's samples (counted at the share py-spy
    recorded when the box starved it) and the timed steps; `kind`: the workload's; `waits`:
    the loop's share waiting on another thread or process (`only_waits`); `compute`: the
    hooks' compute table (the report's `compute`), when they measured one; `split`: the
    model's time by call site from the stacks (the report's `compute_stacks`) when not."""
    rate = starved_rate(metrics, th)
    samples = profile.samples * (rate if rate is not None else 1.0)
    verdict = verdict_of(
        findings,
        samples,
        metrics.get("steps"),
        th,
        unjudged(profile, th, samples),
        starved=rate,
    )
    verdict = unbatched_on_cpu(blind_to_forwards(verdict, kind, metrics), kind, metrics, th)
    verdict = only_waits(verdict, waits, th)
    verdict = compute_unread(verdict, kind, compute, profile, split)
    return compute_left(verdict, compute, profile.loop_runqueue, th, findings)


def compute_unread(
    verdict: dict,
    kind: str | None,
    compute: dict | None,
    profile: Any,
    split: dict | None = None,
) -> dict:
    """A training loop whose step is the model's compute, looked at without the hooks (plain
    `attach`, a recording without them): what that compute does against its work is not read,
    so "no bottleneck" is not sure (five planted jobs whose fixes moved them x4.7 to x54 read
    a sure "no bottleneck" under plain attach, every one named under attach --hooks). `split`:
    the stacks' estimate of where that compute goes; the statement names its top call sites."""
    if verdict.get("finding") is not None or kind != "training" or compute:
        return verdict
    model = sum(profile.share(c) for c in ("forward", "backward", "optimizer"))
    if model <= 0.0:
        return verdict
    return {
        **verdict,
        "sure": False,
        "statement": verdict["statement"]
        + f"; not judged: the model's compute ({model:.0%} of the loop) against its work "
        "(COMP001): this look read no module's work"
        + split_words(split)
        + "; `gpudiag run` or `gpudiag attach --hooks PID` measures it",
    }


def split_words(split: dict | None, top: int = 2) -> str:
    """The stacks' estimate of the model's time in words: the forward's top call sites, the
    backward's and the optimizer's shares ("" without one)."""
    rows = (split or {}).get("rows") or []
    if not split or not rows:
        return ""
    share = {k: sum(r["share"] for r in rows if r["kind"] in ks) for k, ks in _PHASES.items()}
    fwd = [r for r in rows if r["kind"] in ("call", "own") and r["share"] >= 0.005]
    named = ", ".join(f"{r['share']:.0%} in {r['label']}" for r in fwd[:top])
    what = "launch time" if split.get("time") == "launch" else "CPU time"
    return (
        f"; the stacks put the loop's {what} in the model at: the forward {share['forward']:.0%}"
        + (f" (top: {named})" if named else "")
        + f", the backward {share['backward']:.0%}, the optimizer {share['optimizer']:.0%}"
        + " (table: compute_stacks)"
    )


_PHASES = {"forward": ("call", "own"), "backward": ("backward",), "optimizer": ("optimizer",)}


def only_waits(verdict: dict, waits: float, th: Thresholds) -> dict:
    """A process whose loop waits on others at `waiting_loop_share` or more (a server's
    front end whose model runs in worker processes, a main thread joined on its workers) is
    not the job's loop: with no finding of its own, "no bottleneck" is not sure, and the
    statement says where to look."""
    if waits < th.waiting_loop_share or verdict.get("finding") is not None:
        return verdict
    return {
        **verdict,
        "sure": False,
        "statement": verdict["statement"]
        + f"; not judged: the process profiled only waits ({waits:.0%} of its loop samples "
        "wait on another thread or process): it had no work to do (an idle server), or its "
        "work runs elsewhere (a server's model workers: `gpudiag attach` on the front end's "
        "PID profiles its busiest model worker)",
    }


def compute_left(  # noqa: PLR0913 (the verdict, and what it is held against)
    verdict: dict,
    compute: dict | None,
    runqueue: float | None,
    th: Thresholds,
    findings: list[Finding] | tuple[Finding, ...] = (),
) -> dict:
    """A "no bottleneck" where the hooks measured the step's compute against what the device
    attains for the job's shapes (a calibration, on a CPU): not sure while the model's compute
    runs below `comp_verdict_efficiency` of it, with no finding to say why; the statement says
    how far below and where to look. The time is counted on the CPU: the loop thread's wait
    for a CPU (`runqueue`, a share of its time) is the box's, not the model's. A GPU's
    datasheet peak is not an attainable rate for small shapes: not held against it here.
    A note that claims the step's compute (a part far below the rest of the model, no reason
    read) makes it not sure too, named; so does a table with no counted step (its work, so
    COMP001, not judged)."""
    if verdict.get("finding") is not None:
        return verdict
    if compute and compute.get("counted_steps") == 0:
        return {
            **verdict,
            "sure": False,
            "statement": verdict["statement"]
            + "; not judged: the step's compute against its work (COMP001): the hooks timed "
            "the step by module but counted no step's work in this look (they count the first "
            "sampled steps, then one every few seconds): look again for 10 s or more",
        }
    noted = next((f for f in findings if "compute" in spec(f.id).claims and f.impact > 0), None)
    if noted is not None:
        return {
            **verdict,
            "sure": False,
            "statement": verdict["statement"]
            + f"; not sure: {noted.impact:.0%} of the step is left unexplained: {noted.title} "
            f"({noted.id}, a note); the compute table in the report holds each module's share "
            "and efficiency, and a profiler capture of the step (--capture-steps 5) shows its ops",
        }
    if not compute:
        return verdict
    eff = compute.get("model_efficiency")
    source = str((compute.get("attainable") or {}).get("source") or "")
    if eff is None or not source or source.startswith("datasheet"):
        return verdict
    if runqueue is not None and 0.0 <= runqueue < 1.0:
        eff = eff / (1.0 - runqueue)
    eff = min(1.0, eff)
    if eff >= th.comp_verdict_efficiency:
        return verdict
    rows = compute.get("rows") or []
    inside = sum(r.get("share", 0.0) for r in rows if r.get("kind") != "outside")
    return {
        **verdict,
        "sure": False,
        "statement": verdict["statement"]
        + f"; not sure: the model's compute ({inside:.0%} of the step) runs at {eff:.0%} of "
        f"what this CPU attains for its shapes ({source}; comp_verdict_efficiency="
        f"{th.comp_verdict_efficiency:g}) and no rule says why: the compute table in the "
        "report names each module's share and efficiency; a profiler capture of the step "
        "(--capture-steps 5) shows its ops",
    }


def blind_to_forwards(verdict: dict, kind: str | None, metrics: dict) -> dict:
    """An inference job or a server seen without the in-process hooks: no forward's batch
    size, autograd mode or padding is known, so INFER001-INFER003 could not be judged, and "no
    bottleneck" is not sure (a batch-embedding job with autograd on, attached without
    --hooks, got a sure "no bottleneck" 4 of 5 looks)."""
    if kind not in ("inference", "server") or metrics.get("forwards") is not None:
        return verdict
    if verdict.get("finding") is not None:
        return verdict
    why = (
        "the hooks timed its requests but no PyTorch model's forward (a model outside "
        "PyTorch, or none in this process)"
        if metrics.get("requests_in_flight_max") is not None  # the hooks' requests only
        else "they need the in-process hooks (gpudiag run, or attach --hooks)"
    )
    return {
        **verdict,
        "sure": False,
        "statement": verdict["statement"]
        + f"; not judged: the model's batch size per forward, autograd mode and padding "
        f"(INFER001, INFER002, INFER003): {why}" + off_thread_unjudged(kind, metrics),
    }


def off_thread_unjudged(kind: str | None, metrics: dict) -> str:
    """A server whose model runs on pool threads apart from the requests' (the stacks'
    `pool_forward_est`), with too few requests in flight on any stack for SERVE001: those
    an event loop holds while they wait for the pool are on none, so batching is not judged
    (BentoML's sync API under plain attach), unless the kernel's connections counted them."""
    fwd = metrics.get("pool_forward_est")
    if kind != "server" or not fwd:
        return ""
    if in_flight_by_kernel(metrics) is not None:
        return ""  # the kernel's connections counted them: SERVE001 was judged on them
    seen = max(metrics.get("requests_in_flight_est") or 0.0, metrics.get("pool_busy_est") or 0.0)
    return (
        f"; nor batching (SERVE001): the model runs on a thread pool apart from the requests' "
        f"threads ({fwd:.2f} forwards at once, {seen:.1f} requests in flight on the stacks), "
        "and requests waiting for it on an event loop are on no thread's stack: the hooks "
        "count them"
    )


def unbatched_on_cpu(verdict: dict, kind: str | None, metrics: dict, th: Thresholds) -> dict:
    """A batch-inference loop of one item a forward, mostly in its forwards, with no GPU:
    whether a larger batch pays is not judged (INFER002 rests on the GPU's idle time), so "no
    bottleneck" is not sure. Small forwards are mostly fixed cost on a CPU too: a GPT-2's
    `generate()` one prompt at a time went x5 at 8 prompts a call here."""
    if kind != "inference" or verdict.get("finding") is not None or metrics.get("gpus"):
        return verdict
    b50, fwd = metrics.get("forward_batch_p50"), metrics.get("forward_concurrency")
    if b50 is None or b50 > 1 or fwd is None or fwd < th.infer_forward_min:
        return verdict
    if (metrics.get("forwards") or 0.0) < th.serve_min_forwards:
        return verdict
    return {
        **verdict,
        "sure": False,
        "statement": verdict["statement"]
        + f"; not judged: whether a larger batch pays (one item a forward, {fwd:.0%} of the "
        "loop in forwards; INFER002 needs a GPU's idle time): time the job at 8 items a call, "
        "or gpudiag try --fix batch:factor=8 where a DataLoader makes its batches",
    }


def settle(top: Finding) -> str:
    """What settles a finding that is not sure: a longer look, or the hooks where the stacks
    alone cannot."""
    settled_by = spec(top.id).settled_by_hooks
    if settled_by and "hooks" not in top.signals:
        return settled_by
    return "profile longer (--duration) to settle it"


def starved_rate(metrics: dict, th: Thresholds) -> float | None:
    """The share of the asked-for py-spy ticks recorded when the box starved the sampler
    (below `stack_rate_min`), else None."""
    rate = metrics.get("stack_rate_achieved")
    return rate if rate is not None and rate < th.stack_rate_min else None


def run_day(start_ns: int | None) -> date | None:
    """The UTC day a span of the run started (for the price's age); None when unknown."""
    if start_ns is None:
        return None
    try:
        return datetime.fromtimestamp(start_ns / 1e9, timezone.utc).date()
    except (OverflowError, OSError, ValueError):  # a time no clock can show
        return None


def with_more(  # noqa: PLR0913 (the verdict's inputs, and the findings to add)
    findings: list[Finding],
    more: list[Finding],
    verdict: dict,
    profile: Any,
    metrics: dict,
    th: Thresholds,
    compute: dict | None = None,
) -> tuple[list[Finding], dict]:
    """Findings decided after the analysis (the ranks' DIST findings) ranked in, and the
    verdict given again when they lead (it rests on the same samples and compute table, and
    names the same checks that lacked them)."""
    merged = ranked([*findings, *more])
    if not more:
        return merged, verdict
    return merged, judged(merged, profile, metrics, th, compute=compute)


def unjudged(profile: Any, th: Thresholds, samples: float | None = None) -> tuple[str, ...]:
    """The checks that rest on the loop's stack samples and did not have enough of them:
    every one below stack_floor_samples; below min_loop_samples, those whose share's
    interval still straddles their threshold (a share far from it is judged on fewer).
    `samples`: what the samples count for (fewer when the sampler was starved)."""
    n = profile.samples if samples is None else samples
    if n >= th.min_loop_samples:
        return ()
    checks = (
        ("data wait", profile.share("data_wait"), th.data_wait_warn),
        ("checkpoint", profile.share("checkpoint"), th.checkpoint_warn),
        ("storage", profile.share("storage_io"), th.storage_io_warn),
        ("host-bound", profile.share("other"), th.host_user_code_warn),
        ("unexplained loop time", profile.share("other"), th.unexplained_warn),
    )
    out = [
        name
        for name, share, limit in checks
        if n < th.stack_floor_samples or straddles(share, limit, n)
    ]
    if not gil_judged(profile, th):
        out.append("GIL")
    return tuple(out)


def verdict_of(
    findings: list[Finding],
    samples: float,
    steps: float | None,
    th: Thresholds,
    not_judged: tuple[str, ...] = (),
    starved: float | None = None,
) -> dict:
    """How sure the top verdict is, from the samples it rests on.

    `not_judged`: checks that lacked their evidence; with none of the others crossing its
    threshold the verdict names them and is not sure (timed steps judge the data wait only).
    `starved`: the share of py-spy's ticks recorded on a box that starved it: `samples` are
    already counted at that share, and a top finding's confidence alone makes nothing sure.
    """
    verdict = _verdict(findings, samples, steps, th, not_judged, starved is not None)
    if starved is not None:
        verdict["statement"] += (
            f"; stack sampling fell behind (it recorded {starved:.0%} of the ticks asked "
            f"for, below stack_rate_min={th.stack_rate_min:g}): samples counted at that share"
        )
    return verdict


def _verdict(
    findings: list[Finding],
    samples: float,
    steps: float | None,
    th: Thresholds,
    not_judged: tuple[str, ...],
    starved: bool,
) -> dict:
    """verdict_of's decision (see there)."""
    top = next((f for f in findings if f.severity in ("error", "warning")), None)
    enough = samples >= th.min_loop_samples or (steps or 0) >= 10  # hooks time every step
    # an effect far from its threshold is sure on fewer samples: a top finding sure by its
    # own interval, or every check's interval clear of its threshold
    if samples >= th.stack_floor_samples:
        enough = (
            enough
            or not_judged == ()
            or (not starved and top is not None and top.confidence >= th.sure_confidence)
        )
    # a finding on its own signal (GIL001: schedstat and --gil ticks) is judged when its check is
    own = spec(top.id).own_check if top is not None else None
    enough = enough or (own is not None and own not in not_judged)
    # a finding on a server's own counters (Triton's) rests on the requests it counted
    counted = top is not None and "triton" in top.signals
    enough = enough or counted
    basis = f"{samples:.0f} loop stack samples" + (f", {steps:.0f} timed steps" if steps else "")
    basis += ", the requests Triton counted" if counted else ""
    if not enough and (top is not None or samples < th.stack_floor_samples):
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
            f"evidence ({basis}); not judged: {', '.join(not_judged)} (too close to "
            f"{'their thresholds' if len(not_judged) > 1 else 'its threshold'} to tell at "
            f"{samples:.0f} samples; {th.min_loop_samples} settle every check); profile longer "
            "(--duration)",
        }
    unplaced = next(
        (f for f in findings if "unexplained" in spec(f.id).claims and f.impact > 0), None
    )
    if top is None and unplaced is not None:
        # time no rule explains is not a healthy loop: a held-out job (a model deep-copied
        # every step for its EMA, 23% of the loop) read a sure "no bottleneck" while its fix
        # measured x1.20-1.40
        return {
            "finding": None,
            "sure": False,
            "confidence": None,
            "statement": f"no catalogued cause crossed its threshold ({basis}); not sure: "
            f"{unplaced.impact:.0%} of the loop"
            + (
                f" at {Path(unplaced.location.file).name}:{unplaced.location.line}"
                if unplaced.location
                else ""
            )
            + " goes to work no rule explains (LOOP001): look there",
        }
    if top is None:
        return {
            "finding": None,
            "sure": True,
            "confidence": None,
            "statement": f"no bottleneck crossed its threshold ({basis})" + _below(findings),
        }
    if top.speedup_kind == "hypothesis":
        return unverified_verdict(top, basis)
    sure = top.confidence >= th.sure_confidence and (not starved or enough)
    return {
        "finding": top.id,
        "sure": sure,
        "confidence": round(top.confidence, 3),
        "statement": f"{top.id} with {top.confidence:.0%} confidence ({basis})"
        + ("" if sure else "; not sure: " + settle(top)),
    }


def _below(findings: list[Finding]) -> str:
    """The loop time a note still names (a cause under its warning threshold), for a verdict
    that found no bottleneck: it says where the time goes, not only that nothing crossed."""
    notes = [f for f in findings if f.severity == "note" and f.impact > 0 and f.location]
    return "".join(
        f"; under its threshold: {f.id}, {f.impact:.0%} of the loop at "
        f"{Path(f.location.file).name}:{f.location.line}"
        for f in notes[:1]
        if f.location is not None
    )


def unverified_verdict(top: Finding, basis: str) -> dict:
    """A top finding whose fix's effect is a hypothesis: the cause is seen, the gain is not
    proven, so the verdict is not sure until `gpudiag try` (or a change) measures it."""
    low = top.speedup_low or 1.0
    return {
        "finding": top.id,
        "sure": False,
        "confidence": round(top.confidence, 3),
        "statement": f"{top.id} seen with {top.confidence:.0%} confidence ({basis}); its fix's "
        f"effect is unverified (x{low:.2f} to x{top.expected_speedup:.2f}): measure it "
        "(gpudiag try, or the change timed)",
    }


def with_gpu_idle(f: Finding, cp: CriticalPath) -> Finding:
    """A host-side cause states the GPU idle it accounts for, when there is a GPU signal."""
    if (
        cp.gpu_idle is None
        or category(f.id) != "host"
        or not explains_gpu_idle(f.id)
        or any(e.metric == "gpu_idle_share" for e in f.evidence)  # it says so already
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


def merged_verdict(findings: list[dict], docs: list[dict]) -> dict:
    """The merged report's verdict: its own top finding (not the first report's), sure only
    when every merged report was."""
    top = next((f for f in findings if f["severity"] in ("error", "warning")), None)
    sure = all((d.get("verdict") or {}).get("sure") for d in docs)
    n = f"merged from {len(docs)} reports"
    if top is None:
        return {
            "finding": None,
            "sure": sure,
            "confidence": None,
            "statement": f"no bottleneck crossed its threshold ({n})"
            + ("" if sure else "; not sure: a merged report was not"),
        }
    return {
        "finding": top["id"],
        "sure": sure,
        "confidence": top.get("confidence"),
        "statement": f"{top['id']} with {top.get('confidence') or 0:.0%} confidence ({n})"
        + ("" if sure else "; not sure: a merged report was not"),
    }
