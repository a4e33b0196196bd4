"""SERVE001 (one request per forward while several are in flight), INFER001 (inference with
autograd on), INFER002 (one item per forward in an inference loop while the GPU idles),
from the forwards and requests the in-process hooks timed (SERVE001 also from
the stacks), SERVE002 (the request path bound by host work) and SERVE004 (the model run on
the server's event loop), from the stacks."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.cost.projection import right_size_line
from gpudiag.analyzers.measures.serving import (
    LoopSplit,
    event_loop_split,
    forward_busy_share,
    in_flight_by_kernel,
    request_forward_share,
)
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.model.thresholds import Thresholds

SERVE001 = register(
    Spec(
        "SERVE001",
        "One request per forward while several are in flight: batch them",
        "gpu",
        False,
        None,  # a warning at most: whether batching helps is a hypothesis until measured,
        claims=("loop_time", "server_host_time"),
        doc=Doc(
            means=(
                "a server runs one request per model forward (median batch `serve_batch_max` or "
                "less) while `serve_in_flight_min` or more requests are in flight (the hooks' "
                "forwards and requests, at least `serve_min_forwards`); without the hooks, "
                "estimated from the stacks: the forwards run on the request threads themselves "
                "while several are in flight, or on a thread pool's threads apart from them "
                "(one call a request: `run_in_executor`, `asyncio.to_thread`, Starlette's "
                "`run_in_threadpool`, BentoML's sync APIs; no batcher's frames seen) while the "
                "request threads or the pool's calls show several (not sure: a request may "
                "carry several items; requests an event loop holds are on no stack); a "
                "Triton server: its own counters, one request an execution "
                "(`nv_inference_exec_count` against `nv_inference_request_success`) while several"
                " are in flight, or several an execution that the model still runs one forward "
                "each (the hooks' forwards: a Python backend's `execute()` looping)"
            ),
            fix=(
                "dynamic batching: max batch (the power of two that holds the peak in flight, at "
                "most 64) and max wait (the time the measured arrival rate takes to fill it, at "
                "most one forward's time), for a queue-and-model-thread server, Ray Serve's "
                "`@serve.batch`, Triton's `dynamic_batching`"
            ),
            measured=(
                Measured(
                    impact=(
                        "the share of a request's time in its forward (forwards running at once "
                        "over requests in flight, Little's law on the hooks' timings; else the "
                        "stacks' share) x (1 - 1/requests in flight)"
                    ),
                    speedup=(
                        "a hypothesis, unverified: from x1.00 (a batch costs as much as its "
                        "requests, as measured on a CPU; on a Triton server whose forward the "
                        "hooks timed inside an execution, the execution's own cost shared by a "
                        "batch of 2) to the requests in flight sharing one forward as if a batch "
                        "cost one request"
                    ),
                ),
            ),
        ),
    )
)

INFER001 = register(
    Spec(
        "INFER001",
        "Inference with autograd on",
        "host",
        False,
        None,  # a warning at most: what inference mode gives back is a hypothesis,
        claims=("loop_time",),
        doc=Doc(
            means=(
                "inference with autograd on: `forward_grad_share` (`infer_grad_share` or more) of"
                " the outermost forwards ran with `torch.is_grad_enabled()` in a job that never "
                "runs a backward (hooks)"
            ),
            fix=(
                "`torch.inference_mode()` around the model's calls (`no_grad` where the outputs "
                "later meet autograd)"
            ),
            measured=(
                Measured(
                    impact=(
                        "the forwards' share of the work x `forward_grad_share` x 55% (autograd's"
                        " bookkeeping is per op, paid once a forward, and keeps fused inference "
                        "paths off: measured 0-42% of a forward on a CPU, 50-54% on an H100, "
                        "batch 1 to 64)"
                    ),
                    speedup=(
                        "a hypothesis, unverified: from nothing (x1.00) to 55% of the forward "
                        "time; `gpudiag try` measures it (fix kind `inference_mode`)"
                    ),
                ),
            ),
        ),
    )
)

SERVE002 = register(
    Spec(
        "SERVE002",
        "The request path is bound by host work",
        "host",
        False,
        claims=("loop_time", "server_host_time"),
        doc=Doc(
            means=(
                "the request path is bound by host work: `serve_host_warn` or more of its busy "
                "time (the model's forwards on any thread and the request handlers' own samples, "
                "waits and the server's socket I/O left out) is the handlers' CPU work outside "
                "the model, named by location (stacks); judged once the request path has "
                "`min_loop_samples` samples, waits included"
            ),
            fix=(
                "take it off the request path: tokenize once per batch on the model's thread (a "
                "fast tokenizer's batch call), a process pool or more server processes, orjson"
            ),
            measured=(
                Measured(
                    impact="the host share of the request path's busy time",
                    speedup="a bound: that work taken off the path",
                ),
            ),
        ),
    )
)

INFER002 = register(
    Spec(
        "INFER002",
        "Small batches leave the GPU idle in a batch-inference loop",
        "gpu",
        True,
        None,  # a warning at most: whether a larger batch helps is a hypothesis,
        claims=("loop_time", "inference_host_time"),
        doc=Doc(
            means=(
                "a batch-inference loop spends `infer_forward_min` or more of its time in the "
                "model's forwards (hooks) while its GPU idles `infer_gpu_idle_warn` or more "
                "(NVML): its batches are too small for the device. With no GPU, a loop of one "
                "item a forward that spends `infer_forward_min` of its time in its forwards is "
                'not judged: no finding, but "no bottleneck" is not sure and says how to find out'
                " (small forwards are mostly fixed cost on a CPU too: a GPT-2's `generate()` one "
                "prompt at a time went x5 at 8 prompts a call on the 2-core box)"
            ),
            fix=(
                "the batch size x k (a power of two up to 8 that keeps the peak memory times k "
                "under 80% of the GPU's), `gpudiag try --fix batch:factor=k`; inside Hugging "
                "Face's `generate()` (its forwards are decoding steps: the workload says so), "
                "more prompts a call, left-padded, first"
            ),
            measured=(
                Measured(
                    impact=(
                        "1 - 1 / ((1 - F) + F / k): F the loop's share in its forwards, k the "
                        "batch multiple that fits the GPU's memory"
                    ),
                    speedup=(
                        "a hypothesis, unverified: from x1.00 (a larger batch costs as much per "
                        "item) to as if a forward's time were all its fixed work (measured on an "
                        "H100: batch 8 x8.02 items/s); `gpudiag try` measures it (fix kind "
                        "`batch`)"
                    ),
                ),
            ),
        ),
    )
)

SERVE003 = register(
    Spec(
        "SERVE003",
        "The server holds a GPU that idles most of the time",
        "cost",
        False,
        None,
        claims=("loop_time",),
        doc=Doc(
            means=(
                "a server's GPU idles `serve_gpu_idle_warn` or more of the time (NVML "
                "utilisation): its idle share, the requests/s, the peak memory it holds and, at "
                "the run's price, the money that idle costs a day (a cost, not lost time: it "
                "ranks after the causes of lost time)"
            ),
            fix=(
                "scale to zero between bursts, share the GPU (several models or replicas, MPS, a "
                "MIG slice), or the smaller GPU that holds the measured peak memory (the "
                "right-sizing of docs/cost.md)"
            ),
        ),
    )
)

SERVE004 = register(
    Spec(
        "SERVE004",
        "The model runs on the server's event loop: requests wait for each other",
        "host",
        False,
        None,  # a warning at most: what running it off the loop gives back is a hypothesis,
        claims=("loop_time",),
        doc=Doc(
            means=(
                "the model runs on the server's event loop: `serve_loop_forward_warn` or more of "
                "the event-loop thread's samples (asyncio's or uvloop's frames) are in the "
                "model's forward (an `async def` endpoint calling the model), named at the job's "
                "call into it; with the hooks, the request's p50 against the forward's (stacks)"
            ),
            fix=(
                "run the model off the loop: a `def` endpoint (FastAPI's thread pool), "
                "`run_in_threadpool`/`asyncio.to_thread`, `loop.run_in_executor`; or one batching"
                " model thread (SERVE001)"
            ),
        ),
    )
)


# INFER001's range: the share of a forward autograd's bookkeeping costs when nothing needs it
# (activations kept, version counters, no fused inference paths: its work is per op, paid
# once a forward, not per item). Measured with autograd on against inference_mode, the same
# model's forwards alternated (benchmarks/autograd_cost.py, gpu_batch_autograd.py): on a CPU
# 11-42% of the forward (a small BERT and the planted server's transformer, batch 1 to 32);
# on an H100 the transformer 50-54% at batch 1, 8 and 64 alike (launch-bound: its fused
# inference path runs fewer kernels). A public Flask server's 6-layer BERT at 40-80 tokens on a
# CPU (matmul-bound) measured nothing: x0.87-0.98 served, its forwards x1.06 at the median.
# No rule fitted every one; the range holds all, from nothing.
AUTOGRAD_COST = 0.0
AUTOGRAD_FIXED_COST = 0.55
MAX_BATCH_LIMIT = 64  # the largest max batch size suggested
HK = "hooks"


def batching_values(m: dict) -> tuple[int, float]:
    """(max batch, max wait in ms): the power of two that holds the requests seen in flight
    at once, and the time the measured arrival rate takes to fill it, never more than one
    forward's time (waiting longer costs more than the batch saves)."""
    peak = max(
        2.0,
        m.get("requests_in_flight_max")
        or m.get("connections_in_flight_max")  # the kernel's, without the hooks
        or m.get("requests_in_flight_mean")
        or m.get("requests_in_flight_est")
        or 2.0,
    )
    batch = min(MAX_BATCH_LIMIT, 2 ** math.ceil(math.log2(peak)))
    rate = m.get("requests_per_second") or m.get("forwards_per_second") or 0.0
    fill = (batch - 1) / rate if rate > 0 else math.inf
    wait = min(fill, m.get("forward_time_p50_s") or m.get("execution_time_mean_s") or fill)
    return batch, round(wait * 1e3, 1) if math.isfinite(wait) else 0.0


@dataclass(frozen=True)
class Seen:
    """What SERVE001 rests on: requests in flight, the share of a request in the forward,
    the forward's batch as told, and where that was measured."""

    inflight: float
    share: float
    batch: str
    source: str
    confidence: float
    evidence: tuple[Evidence, ...]
    looped: bool = False  # Triton batched the requests, the model ran one forward each
    basis: str = ""  # how the requests in flight were read, where not the source's usual way


def seen_by_hooks(m: dict, th: Thresholds) -> Seen | None:
    """Batch 1 and the requests in flight, timed by the hooks."""
    forwards, b50 = m.get("forwards") or 0.0, m.get("forward_batch_p50")
    inflight, share = m.get("requests_in_flight_mean"), request_forward_share(m)
    if forwards < th.serve_min_forwards or b50 is None or b50 > th.serve_batch_max:
        return None
    if inflight is None or inflight < th.serve_in_flight_min or not share:
        return None
    ev = (
        th.evidence("serve_batch_max", "forward_batch_p50", b50, "items", "<=", HK),
        th.evidence(
            "serve_in_flight_min",
            "requests_in_flight_mean",
            round(inflight, 3),
            "requests",
            ">=",
            HK,
        ),
        th.evidence("serve_min_forwards", "forwards", forwards, "count", ">=", HK),
        Evidence("request_forward_share", round(share, 4), "ratio", source=HK),
        Evidence("requests_per_second", m.get("requests_per_second"), "1/s", source=HK),
        Evidence("forward_time_p50_s", m.get("forward_time_p50_s"), "s", source=HK),
    )
    return Seen(inflight, share, f"{b50:.0f} request", HK, 0.95, ev)


TR = "triton"


def seen_by_triton(m: dict, th: Thresholds) -> Seen | None:
    """A Triton server's own counters: executions of one request each (no dynamic batching,
    or none formed) while several are in flight; the share of a request's time queued for
    the model or in it (the queue is there because the executions run one at a time)."""
    per_exec, executions = m.get("requests_per_execution"), m.get("executions") or 0.0
    inflight = m.get("requests_in_flight_mean")
    queued, computing = m.get("request_queue_share"), m.get("request_compute_share")
    if per_exec is None:
        return None
    looped = round(per_exec) > th.serve_batch_max and one_forward_a_request(m, th)
    if round(per_exec) > th.serve_batch_max and not looped:
        return None
    if executions < th.serve_min_forwards or inflight is None or queued is None:
        return None
    if inflight < th.serve_in_flight_min:
        return None
    share = min(1.0, queued + (computing or 0.0))
    ev: tuple[Evidence, ...] = (
        th.evidence(
            "serve_batch_max", "requests_per_execution", round(per_exec, 3), "requests", "<=", TR
        ),
        th.evidence(
            "serve_in_flight_min",
            "requests_in_flight_mean",
            round(inflight, 3),
            "requests",
            ">=",
            TR,
        ),
        th.evidence("serve_min_forwards", "executions", executions, "count", ">=", TR),
        Evidence("request_queue_share", round(queued, 4), "ratio", source=TR),
        Evidence("request_compute_share", round(computing or 0.0, 4), "ratio", source=TR),
        Evidence("requests_per_second", m.get("requests_per_second"), "1/s", source=TR),
        Evidence("execution_time_mean_s", m.get("execution_time_mean_s"), "s", source=TR),
    )
    if looped:
        ev += (
            th.evidence(
                "serve_batch_max",
                "forward_batch_p50",
                m.get("forward_batch_p50"),
                "items",
                "<=",
                HK,
            ),
            Evidence("forwards", m.get("forwards"), "count", source=HK),
        )
        what = f"{per_exec:.1f} requests, run one forward each (the hooks' forwards)"
        return Seen(inflight, share, what, TR, 0.95, ev, looped=True)
    return Seen(inflight, share, f"{per_exec:.1f} request", TR, 0.95, ev)


def one_forward_a_request(m: dict, th: Thresholds) -> bool:
    """Triton hands an execution several requests, and the model still runs one forward a
    request (a Python backend's execute() looping over them, as the python_backend
    README's example does): the hooks' forwards are batch 1, about one a request."""
    b50, forwards, requests = m.get("forward_batch_p50"), m.get("forwards"), m.get("requests")
    if b50 is None or not forwards or not requests:
        return False
    return b50 <= th.serve_batch_max and forwards >= 0.8 * requests


def seen_in_stacks(m: dict, th: Thresholds, samples: float) -> Seen | None:
    """Without the hooks: the model's forwards run on the request threads themselves (no
    batcher), each on its own request's input, while the stacks show several in flight."""
    inflight, share = m.get("requests_in_flight_est"), m.get("handler_forward_share")
    if samples < th.min_loop_samples or inflight is None:
        return None
    if not share and m.get("pool_forward_est"):
        return seen_off_thread(m, th, inflight, samples)
    if not share:
        return None
    if inflight < th.serve_in_flight_min:
        return None
    ev = (
        th.evidence(
            "serve_in_flight_min",
            "requests_in_flight_est",
            round(inflight, 3),
            "requests",
            ">=",
            "stacks",
        ),
        Evidence("handler_forward_share", round(share, 4), "ratio", source="stacks"),
        th.evidence("min_loop_samples", "stack_samples", samples, "samples", ">="),
    )
    # below sure: a request may carry several items (the stacks cannot tell)
    return Seen(inflight, share, "one request (on its own thread)", "stacks", 0.75, ev)


def seen_off_thread(m: dict, th: Thresholds, handling: float, samples: float) -> Seen | None:
    """Without the hooks: the model runs on pool threads apart from the requests' (a thread
    pool's work item, one call a request: `run_in_executor`, `asyncio.to_thread`, Starlette's
    `run_in_threadpool`, BentoML's sync APIs), no batcher seen. The requests in flight are at
    least the request threads' samples per tick (those waiting on the pool included) and at
    least the pool's calls in progress; a request's share in its forward is the forwards
    running at once over them (Little's law). An event loop's requests awaiting the pool are
    on no thread's stack: the count is a lower bound, and SERVE001 is not named below it."""
    fwd, busy = m.get("pool_forward_est") or 0.0, m.get("pool_busy_est") or 0.0
    floor = max(handling, busy)  # on the stacks: each a lower bound
    mean, serving, basis = floor, floor, ""
    kernel = in_flight_by_kernel(m)
    if kernel is not None and kernel[0] > floor:
        mean, serving = kernel  # over the look, and while any request was in flight
        basis = (
            "the requests in flight read from the kernel's connections (received, not yet "
            "answered), the forwards from the stacks"
        )
    if serving < th.serve_in_flight_min or fwd <= 0:
        return None
    share = min(1.0, fwd / mean)  # Little's law: forwards at once over requests in flight
    ev: tuple[Evidence, ...] = (
        th.evidence(
            "serve_in_flight_min",
            "requests_in_flight_conn" if basis else "requests_in_flight_est",
            round(serving, 3),
            "requests",
            ">=",
            "stacks",
        ),
        Evidence("requests_in_flight_est", round(floor, 3), "requests", source="stacks"),
        Evidence("pool_forward_est", round(fwd, 4), "count", source="stacks"),
        Evidence("pool_busy_est", round(busy, 4), "count", source="stacks"),
        Evidence("pool_threads", m.get("pool_threads"), "count", source="stacks"),
        th.evidence("min_loop_samples", "stack_samples", samples, "samples", ">="),
    )
    if basis:
        ev += (
            Evidence("connections_in_flight", round(mean, 3), "requests", source="conns"),
            Evidence(
                "connections_busy_share",
                round(m.get("connections_busy_share") or 0.0, 4),
                "ratio",
                source="conns",
            ),
        )
    what = "one request a call (on a pool thread apart from the request's)"
    # below sure, and below the request threads' own reading: a pool call may carry a batch
    # the handler gathered, and the stacks cannot tell
    return Seen(serving, share, what, "stacks", 0.6, ev, basis=basis)


def batched_floor(c: Context, share: float, k: float) -> float:
    """The low end of batching's gain where a GPU runs the forwards. At batch 1 a forward is
    mostly the host launching kernels onto an idle GPU; a batch k times larger costs at most
    that launch once plus k times the GPU's busy time (its kernels taken as growing with the
    batch: an upper bound on the cost). `share`: the forwards' share of the work. 1.0
    without a GPU signal: a CPU's forward grows with its batch (the planted server's
    batching gained nothing on a CPU), so there is no floor to give."""
    used = [s for s in c.stats if s.job_uses_gpu and s.busy is not None]
    if not used or share <= 0 or k <= 1:
        return 1.0
    busy = sum(s.busy or 0.0 for s in used) / len(used)
    g = min(1.0, busy / share)  # the GPU's busy share of the forwards' time
    per_item = k / ((1.0 - g) + k * g)  # a forward's gain per item at batch k
    return 1.0 / ((1.0 - share) + share / per_item)


def serve001(c: Context) -> list[Finding]:
    """SERVE001: a server runs one request per forward while several are in flight."""
    m, th = c.metrics, c.th
    if c.workload is None or c.workload.kind != "server":
        return []
    seen = seen_by_triton(m, th) or seen_by_hooks(m, th)
    if seen is None and not m.get("forwards") and not m.get("executions"):
        seen = seen_in_stacks(m, th, c.profile.samples)
    if seen is None:
        return []
    batch, wait_ms = batching_values(m)
    together = max(2.0, seen.inflight)  # requests that could share a forward, on average
    impact = seen.share * (1.0 - 1.0 / together)
    # where execute() loops, the server's cost grows with the requests it answers, fix or
    # not (a Python backend's answer tensors, one a request): only the forwards merge
    paid = execution_overhead(m) if seen.source == TR and not seen.looped else None
    floor = max(batched_floor(c, seen.share, together), _overhead_floor(paid, seen.share, 2.0))
    low = min(floor, speedup_from_impact(impact))
    msg = _serve001_message(seen, m, together)
    actions = _serve001_actions(seen.source, batch, wait_ms, seen.looped)
    for folder, batcher in FRAMEWORK_BATCHERS:  # the framework's own batcher first
        if _in_frames(c, folder):
            actions = (batcher(batch, wait_ms, m), *actions)
    summary = f"Batch the requests in flight (max batch {batch}" + (
        f", max wait {wait_ms} ms)" if wait_ms else ")"
    )
    return [
        new_finding(
            "SERVE001",
            th,
            confidence=seen.confidence,
            impact=impact,
            message=msg + " Whether it helps depends on what a batch costs on this device: "
            "unverified until measured.",
            evidence=seen.evidence,
            recommendation=Recommendation(summary, actions),
            expected_speedup=speedup_from_impact(impact),
            signals=(seen.source,),
            speedup_basis=f"a hypothesis, unverified: from x{low:.2f} ("
            + _floor_basis(c, seen, together, paid)
            + f") to x{speedup_from_impact(impact):.2f} ({together:.1f} requests share one "
            "forward at the cost of one); measure it",
            speedup_kind="hypothesis",
            speedup_low=round(low, 3),
        )
    ]


def _in_frames(c: Context, folder: str) -> bool:
    """Whether the job's stacks (any thread's: the loop's may be a worker's, not seen yet)
    pass through a library's folder ("/litserve/")."""
    return any(folder in stack for per in c.view.stacks.values() for stack, _code in per)


def _litserve_batching(batch: int, wait_ms: float, m: dict) -> str:
    """LitServe's own batcher with the values: its LitAPI's max_batch_size and batch_timeout
    (seconds), and batch()/unbatch() to stack the decoded inputs and split the output."""
    fwd_s = m.get("forward_time_p50_s")
    wait_s = wait_ms / 1e3 if wait_ms else max(0.001, round(fwd_s or 0.01, 3))
    return (
        f"LitServe: LitAPI(max_batch_size={batch}, batch_timeout={wait_s:g}) (passed to your "
        "LitAPI subclass), with batch(inputs) stacking the decoded requests (torch.stack) and "
        "unbatch(output) splitting the answer; predict() then gets the batch"
    )


def _bentoml_batching(batch: int, wait_ms: float, m: dict) -> str:
    """BentoML's adaptive batching (1.2+ services): batchable=True with max_batch_size, and
    max_latency_ms, which is not a wait but BentoML's cap on a request's queueing plus its
    batch's run (requests past it are refused with 503): well above the p99 seen."""
    p99 = m.get("request_latency_p99_s") or m.get("request_latency_p95_s") or 0.1
    cap_ms = max(1000, math.ceil(p99 * 10 * 10) * 100)  # ten times the p99, in 100 ms steps
    return (
        f"BentoML: @bentoml.api(batchable=True, max_batch_size={batch}, "
        f"max_latency_ms={cap_ms}) on the service's API method, which then takes a batch "
        "(a list, or an array or tensor along batch_dim=0) and returns one answer per input; "
        "BentoML's dispatcher picks the wait itself, and refuses (503) a request whose queueing "
        f"and run would pass max_latency_ms: keep it well above the p99 ({p99 * 1e3:.0f} ms here)"
    )


# a library's folder in the job's frames, and its own batcher's advice with the values
FRAMEWORK_BATCHERS: tuple[tuple[str, Callable[[int, float, dict], str]], ...] = (
    ("/litserve/", _litserve_batching),
    ("/_bentoml_impl/", _bentoml_batching),
)


def execution_overhead(m: dict) -> tuple[float, float] | None:
    """(the model's forward, an execution's time outside it) in seconds, where the hooks
    timed the forward inside a Triton execution (PyTriton's callable, a Python backend):
    the server's own cost of an execution, paid once a batch."""
    fwd, ex = m.get("forward_time_p50_s"), m.get("execution_time_mean_s")
    forwards, executions = m.get("forwards"), m.get("executions")
    # the forwards an execution runs (several where execute() loops over its requests)
    each = max(1.0, forwards / executions) if forwards and executions else 1.0
    if not fwd or not ex or ex <= fwd * each:
        return None
    return fwd, ex - fwd * each


def _overhead_floor(paid: tuple[float, float] | None, share: float, k: float) -> float:
    """Batching's gain with the forward growing with its batch (as on a CPU) and only the
    execution's overhead shared by the batch's k requests. SERVE001 takes k = 2: the batches
    a short max wait forms hold fewer than the requests in flight (a PyTriton server's, 2.3
    on average with 3.9 in flight; its gain measured x1.76-2.41)."""
    if paid is None or k <= 1 or share <= 0:
        return 1.0
    fwd, over = paid
    per_item = (fwd + over) / (fwd + over / k)
    return 1.0 / ((1.0 - share) + share / per_item)


def _floor_basis(c: Context, seen: Seen, k: float, paid: tuple[float, float] | None) -> str:
    """Why the low end of SERVE001's range is what it is."""
    gpu = batched_floor(c, seen.share, k)
    if paid is not None and _overhead_floor(paid, seen.share, 2.0) > gpu:
        return (
            f"each execution's {paid[1] * 1e3:.1f} ms outside the model's {paid[0] * 1e3:.1f} "
            "ms forward (the server's own) paid once a batch of 2, the forward growing with "
            "its batch as on a CPU"
        )
    if gpu > 1.0:
        return (
            "a batch costs its requests' GPU time and one launch: the GPU idles through "
            "batch 1's forwards"
        )
    return "a batch costs as much as its requests, as measured on a CPU"


def _serve001_message(seen: Seen, m: dict, together: float) -> str:
    """What SERVE001 saw: the batch per forward, the requests in flight and the forward's
    share of a request, as measured where it was."""
    if seen.source == TR:
        per_exec = max(1.0, m.get("requests_per_execution") or 1.0)
        per_s = (m.get("requests_per_second") or 0.0) / per_exec
        ex = m.get("execution_time_mean_s") or 0.0
        paid = execution_overhead(m)
        inside = f", the model's forward {paid[0] * 1e3:.1f} ms of it" if paid else ""
        return (
            f"Each execution of the model in Triton runs {seen.batch} while "
            f"{seen.inflight:.1f} are in flight on average (counted by Triton: "
            f"nv_inference_exec_count against nv_inference_request_success); "
            f"{m.get('request_queue_share') or 0:.0%} of a request's time is queued for the "
            f"model and {m.get('request_compute_share') or 0:.0%} in it ({ex * 1e3:.1f} ms an "
            f"execution{inside}, {per_s:.0f} executions/s). "
            + (
                "Run as one forward, an execution's requests take about one forward's time."
                if seen.looped
                else f"Triton's dynamic batcher runs {together:.1f} of them in about one "
                "execution's time."
            )
        )
    fwd = m.get("forward_time_p50_s")
    timing = (
        f" ({fwd * 1e3:.1f} ms at p50, {m.get('forwards_per_second') or 0:.0f} forwards/s)"
        if fwd
        else ""
    )
    how = seen.basis or (
        "measured by the hooks" if seen.source == HK else "estimated from the stacks"
    )
    return (
        f"Each forward of the model runs {seen.batch} while {seen.inflight:.1f} are in flight "
        f"on average ({how}); {seen.share:.0%} of a request's time is its forward{timing}. "
        f"Batching the requests in flight runs {together:.1f} of them in about one forward's "
        "time."
    )


def _serve001_actions(
    source: str, batch: int, wait_ms: float, looped: bool = False
) -> tuple[str, ...]:
    """SERVE001's fixes with their values: Triton's own settings for a Triton server, else a
    batcher in the server and the frameworks' batchers."""
    delay = f"max_queue_delay_microseconds: {wait_ms * 1e3:.0f}" if wait_ms else ""
    if source == TR and looped:
        return (
            "a Python backend's execute(requests): run the requests Triton batched as one "
            "forward (their inputs concatenated, the output split), not one forward each",
            f"then keep dynamic_batching with max_batch_size: {batch}"
            + (f", {delay}" if wait_ms else ""),
        )
    if source == TR:
        return (
            f"config.pbtxt: max_batch_size: {batch} and dynamic_batching {{ {delay} }} (the "
            "model's inputs then take a leading batch dimension, and only requests of one "
            "shape batch together: pad them to a fixed length, or allow ragged batches); a "
            "Python backend's execute(requests) then gets several: run them as one forward "
            "(their inputs concatenated, the output split), not one forward each",
            f"PyTriton: ModelConfig(max_batch_size={batch}, batcher=DynamicBatcher("
            + (f"max_queue_delay_microseconds={wait_ms * 1e3:.0f}" if wait_ms else "")
            + ")) with the inference function decorated @batch",
        )
    wait = f"max_wait_ms={wait_ms}" if wait_ms else "a max wait of about one forward's time"
    return (
        f"queue the requests to one model thread that takes up to max_batch_size={batch} at "
        f"once, with {wait} for more, and runs them as one forward",
        f"Ray Serve: @serve.batch(max_batch_size={batch}"
        + (f", batch_wait_timeout_s={wait_ms / 1e3:g})" if wait_ms else ")"),
        f"Triton: dynamic_batching with max_batch_size: {batch}"
        + (f", {delay}" if wait_ms else ""),
    ) + (
        ()
        if wait_ms
        else ("gpudiag run (or instrument() in the server) measures the forward time and rate",)
    )


def infer001(c: Context) -> list[Finding]:
    """INFER001: forwards run with autograd on in a job that never runs a backward."""
    m, th = c.metrics, c.th
    forwards, grad = m.get("forwards") or 0.0, m.get("forward_grad_share")
    if (
        c.workload is None
        or c.workload.kind not in ("server", "inference")
        or forwards < th.serve_min_forwards
        or grad is None
        or grad < th.infer_grad_share
    ):
        return []
    busy = forward_busy_share(m, c.workload.kind)
    share = min(1.0, busy or 0.0) * grad
    low, high = share * AUTOGRAD_COST, share * AUTOGRAD_FIXED_COST
    msg = (
        f"{grad:.0%} of the {forwards:.0f} model forwards ran with autograd on, and the job "
        "never runs a backward: every forward records what a backward would need, for nothing."
    )
    ev = (
        th.evidence(
            "infer_grad_share", "forward_grad_share", round(grad, 4), "ratio", ">=", "hooks"
        ),
        th.evidence("serve_min_forwards", "forwards", forwards, "count", ">=", "hooks"),
        Evidence(
            "forward_busy_share", None if busy is None else round(busy, 4), "ratio", source="hooks"
        ),
        Evidence("forward_batch_p50", m.get("forward_batch_p50"), "items", source="hooks"),
        Evidence("forward_time_p50_s", m.get("forward_time_p50_s"), "s", source="hooks"),
    )
    actions = (
        "wrap the model's calls in `with torch.inference_mode():` (or decorate the "
        "handler or loop with @torch.inference_mode())",
        "torch.no_grad() where tensors made inside must later be used with autograd",
        "model.eval() as well, for dropout and batch norm (it does not turn autograd off)",
    )
    return [
        new_finding(
            "INFER001",
            th,
            confidence=0.95,
            impact=high,
            message=msg,
            evidence=ev,
            recommendation=Recommendation("Run inference under torch.inference_mode()", actions),
            expected_speedup=speedup_from_impact(high),
            signals=("hooks",),
            speedup_basis=f"a hypothesis, unverified: autograd's bookkeeping from "
            f"{AUTOGRAD_COST:.0%} of the forward time (x{speedup_from_impact(low):.2f}) to "
            f"{AUTOGRAD_FIXED_COST:.0%} (x{speedup_from_impact(high):.2f}; measured 0-42% of "
            "a forward on a CPU, 50-54% on an H100); gpudiag try measures it",
            speedup_kind="hypothesis",
            speedup_low=speedup_from_impact(low),
            fix={"kind": "inference_mode", "values": {}},
        )
    ]


def samples_evidence(metric: str, samples: float, th: Thresholds) -> Evidence:
    """Stack samples (the request path's, an event loop's) against the least a share of
    them is judged on."""
    return th.evidence("min_loop_samples", metric, samples, "samples", ">=", "stacks")


def serve002(c: Context) -> list[Finding]:
    """SERVE002: the request path's busy time (the model's forwards, the handlers' own work
    and the server framework's, waits left out) is mostly the handlers' CPU work outside the
    model (tokenizing, decoding, JSON, pre- and post-processing: the app's code and what it
    calls, not the framework's parsing and routing), named by location."""
    th = c.th
    if c.workload is None or c.workload.kind != "server":
        return []
    split = c.handlers
    # the request path seen enough (its waits included); the share's confidence rests on
    # its busy samples
    if split is None or split.samples < th.min_loop_samples:
        return []
    share = split.host / split.busy
    conf = confidence_above(share, th.serve_host_warn, split.busy)
    if share < th.serve_host_warn or conf < th.min_confidence:
        return []
    named = "; ".join(f"{loc.function} ({loc.file}:{loc.line}) {s:.0%}" for loc, s in split.top)
    model = split.model / split.busy
    frame = split.framework / split.busy
    msg = (
        f"{share:.0%} of the request path's busy time is the handlers' own CPU work outside "
        f"the model ({model:.0%} the model's forwards"
        + (f", {frame:.0%} the server framework's own work" if frame >= 0.005 else "")
        + "; waits left out)"
        + (f"; most in {named}" if named else "")
        + ". The handler threads share one GIL with the model: that work holds up every "
        "request in flight."
    )
    ev = (
        th.evidence(
            "serve_host_warn", "request_path_host_share", round(share, 4), "ratio", ">=", "stacks"
        ),
        samples_evidence("request_path_samples", split.samples, th),
        Evidence("request_path_busy_samples", split.busy, "samples", source="stacks"),
        Evidence(
            "handler_forward_share",
            round(split.forward / split.samples, 4),
            "ratio",
            source="stacks",
        ),
        Evidence(
            "request_path_framework_share",
            round(split.framework / split.busy, 4),
            "ratio",
            source="stacks",
        ),
    ) + tuple(
        Evidence(f"handler_share[{loc.function}:{loc.line}]", round(s, 4), "ratio", source="stacks")
        for loc, s in split.top
    )
    actions = (
        "take the work off the request path: tokenize or pre-process once per batch on the "
        "model's thread (a fast tokenizer's batch call: tokenizers' encode_batch), not per "
        "request on the handler",
        "run CPU-heavy pre/post-processing in a process pool "
        "(concurrent.futures.ProcessPoolExecutor), or serve from several processes "
        "(gunicorn/uvicorn --workers N)",
        "a faster JSON codec (orjson) when the payloads are large",
    )
    return [
        new_finding(
            "SERVE002",
            th,
            confidence=conf,
            impact=share,
            message=msg,
            evidence=ev,
            recommendation=Recommendation("Take the host work off the request path", actions),
            expected_speedup=speedup_from_impact(share),
            location=split.top[0][0] if split.top else None,
            signals=("stacks",),
            speedup_basis="at most: the handlers' CPU work outside the model taken off the "
            "request path (the path then runs the model only)",
            speedup_kind="bound",
        )
    ]


MAX_BATCH_FACTOR = 8  # the largest batch multiple INFER002 suggests
MEMORY_ROOM = 0.8  # INFER002's larger batch keeps its peak under this share of the GPU's memory


def batch_factor(used: list) -> int:
    """The largest power of two up to MAX_BATCH_FACTOR by which the batch can grow with the
    peak memory (as if all of it grew with the batch) under MEMORY_ROOM of the GPU's."""
    k = MAX_BATCH_FACTOR
    for s in used:
        if s.mem_peak and s.mem_total:
            while k > 1 and s.mem_peak * k > MEMORY_ROOM * s.mem_total:
                k //= 2
    return k


def infer002(c: Context) -> list[Finding]:
    """INFER002: a batch-inference loop mostly in its model's forwards while its GPU idles:
    batches too small for the device. A hypothesis (a larger batch may cost as much per item
    on a device it already fills), measured by `gpudiag try` (fix kind `batch`)."""
    m, th = c.metrics, c.th
    used = [s for s in c.stats if s.job_uses_gpu and s.busy is not None]
    fwd, b50 = m.get("forward_concurrency"), m.get("forward_batch_p50")
    if c.workload is None or c.workload.kind != "inference" or not used or b50 is None:
        return []
    idle = sum(1.0 - (s.busy or 0.0) for s in used) / len(used)
    k = batch_factor(used)
    if (m.get("forwards") or 0.0) < th.serve_min_forwards or fwd is None or k < 2:
        return []
    if idle < th.infer_gpu_idle_warn or fwd < th.infer_forward_min:
        return []
    share = min(1.0, fwd)
    # the high end: a batch k times larger costing what one call costs now, the loop's work
    # around the forward too (a library called once per item tokenizes and copies once per
    # call: sentence-transformers' encode() per sentence went x53 at batch 64, far above the
    # forwards' share alone, x2.4 at 8); a DataLoader's per-item loading does not shrink so
    high = (
        float(k)
        if c.shares.get("data_wait", 0.0) < th.data_wait_warn
        else (1.0 / ((1.0 - share) + share / k))
    )
    low = min(batched_floor(c, share, k), high)
    ev = (
        th.evidence(
            "infer_gpu_idle_warn",
            "gpu_idle_share",
            round(idle, 4),
            "ratio",
            ">=",
            "nvml utilization",
        ),
        th.evidence("infer_forward_min", "forward_busy_share", round(share, 4), "ratio", ">=", HK),
        Evidence("forward_batch_p50", b50, "items", source=HK),
        Evidence("forward_time_p50_s", m.get("forward_time_p50_s"), "s", source=HK),
        Evidence(
            "gpu_memory_peak",
            round(max(s.mem_peak or 0.0 for s in used) / 2**30, 2),
            "GiB",
            source="nvml",
        ),
    )
    msg = (
        f"The loop spends {share:.0%} of its time in the model's forwards (batch {b50:.0f}) "
        f"while the GPU sits idle {idle:.0%} of the time: each forward is too small to fill "
        f"it. A batch {k}x larger fits its memory (peak x{k} under {MEMORY_ROOM:.0%})."
    )
    generate = (
        (
            f"generate() {b50 * k:.0f} prompts a call, not one: tokenizer.padding_side = "
            f"'left', then model.generate(**tokenizer(prompts[i:i + {b50 * k:.0f}], "
            "padding=True, return_tensors='pt'), ...): each decoding step then runs the "
            "whole batch",
        )
        if c.workload.generates
        else ()
    )
    actions = generate + (
        f"DataLoader(..., batch_size={b50 * k:.0f}) (or the loop's own batch size x{k}); "
        f"for a library called once per item, one call per batch: model.encode(texts, "
        f"batch_size={b50 * k:.0f}) (sentence-transformers), pipeline(..., "
        f"batch_size={b50 * k:.0f}) (transformers)",
        f"gpudiag try --fix batch:factor={k} -- <the job> measures it first",
    )
    return [
        new_finding(
            "INFER002",
            th,
            confidence=0.9,
            impact=1.0 - 1.0 / high,
            message=msg,
            evidence=ev,
            recommendation=Recommendation(f"Raise the batch size x{k}", actions),
            expected_speedup=high,
            signals=(HK, "nvml utilization"),
            speedup_basis=f"a hypothesis, unverified: from x{low:.2f} ("
            + (
                "the forwards' GPU time growing with the batch, their launch paid once"
                if low > 1.0
                else "a larger batch costs as much per item"
            )
            + f") to x{high:.2f} (as if each call's work, {share:.0%} of the loop in the "
            f"forwards, were fixed per call and {k}x fewer calls ran); gpudiag try measures it",
            speedup_kind="hypothesis",
            speedup_low=round(low, 3),
            fix={"kind": "batch", "values": {"factor": k}},
        )
    ]


def serve003(c: Context) -> list[Finding]:
    """SERVE003: a server's GPU idles most of the time (NVML): its idle share, the money that
    idle costs a day at the run's price, and the choices (scale to zero, share the GPU, a
    smaller GPU that holds the measured peak memory). A cost, not lost time: impact 0."""
    th = c.th
    used = [s for s in c.stats if s.job_uses_gpu and s.busy is not None]
    if c.workload is None or c.workload.kind != "server" or not used:
        return []
    idle = sum(1.0 - (s.busy or 0.0) for s in used) / len(used)
    if idle < th.serve_gpu_idle_warn:
        return []
    m = c.metrics
    rate = m.get("requests_per_second")
    peak = max((s.mem_peak or 0.0) for s in used)
    ev = [
        th.evidence(
            "serve_gpu_idle_warn",
            "gpu_idle_share",
            round(idle, 4),
            "ratio",
            ">=",
            "nvml utilization",
        ),
        Evidence("requests_per_second", rate, "1/s", source=HK),
        Evidence("gpu_memory_peak", round(peak / 2**30, 2), "GiB", source="nvml"),
    ]
    traffic = f"{rate:.1f} requests/s" if rate else "no request timed"
    msg = (
        f"The server's {len(used)}x {used[0].name} sat idle {idle:.0%} of the time "
        f"({traffic}) while holding {peak / 2**30:.1f} GiB"
    )
    actions = [
        "scale to zero between bursts (a serverless or autoscaled deployment with min "
        "replicas 0), or keep the model on CPU for a trickle of requests",
        "share the GPU: serve several models or replicas on it (several processes, NVIDIA "
        "MPS, or a MIG slice that holds the peak memory)",
    ]
    cost = None
    if c.price is not None:
        day = len(used) * c.price.usd_per_gpu_hour * 24
        cost = {"usd_per_hour": round(day * idle / 24, 4), "usd_per_day": round(day * idle, 2)}
        msg += (
            f": about ${day * idle:,.0f} of ${day:,.0f} a day pays for idle GPU time at "
            f"${c.price.usd_per_gpu_hour:.2f}/GPU-hour ({c.price.source})"
        )
        ev += [
            Evidence("price", c.price.usd_per_gpu_hour, "USD/GPU-hour", source=c.price.source),
            Evidence("idle_spend", round(day * idle, 2), "USD/day", source="price x idle share"),
        ]
        sizing = right_size_line(c.right_size) or (c.right_size or {}).get("statement")
        if sizing:
            actions.append(f"a smaller GPU that holds the {peak / 2**30:.1f} GiB: {sizing}")
    return [
        new_finding(
            "SERVE003",
            th,
            confidence=0.9,
            impact=0.0,
            message=msg + ".",
            evidence=tuple(ev),
            recommendation=Recommendation(
                "Give the idle GPU back: scale to zero, share it, or a smaller one", tuple(actions)
            ),
            expected_speedup=1.0,
            cost=cost,
            signals=("nvml utilization",),
            speedup_basis="none: money spent on a GPU the requests leave idle, not lost time",
        )
    ]


def serve004(c: Context) -> list[Finding]:
    """SERVE004: the model's forwards run on the server's event loop (an `async def` endpoint
    calling the model): while one runs, no other request is accepted, read or answered."""
    th = c.th
    if c.workload is None or c.workload.kind != "server":
        return []
    split = event_loop_split(c.view)
    if split is None or split.samples < th.min_loop_samples:
        return []
    share = split.forward / split.samples
    conf = confidence_above(share, th.serve_loop_forward_warn, split.samples)
    if share < th.serve_loop_forward_warn or conf < th.min_confidence:
        return []
    return [_serve004(c, share, conf, split)]


def _serve004(c: Context, share: float, conf: float, split: LoopSplit) -> Finding:
    m, th, where = c.metrics, c.th, split.where
    p50, fwd = m.get("request_latency_p50_s"), m.get("forward_time_p50_s")
    waited = (
        f" A request took {p50 * 1e3:.0f} ms at p50 against a {fwd * 1e3:.1f} ms forward: "
        "the rest is mostly its wait for the forwards before it."
        if p50 and fwd and p50 > 1.5 * fwd
        else ""
    )
    place = f" (called from {where.function}, {where.file}:{where.line})" if where else ""
    msg = (
        f"The server's event loop spends {share:.0%} of its time in the model's forward{place}. "
        "While a forward runs, the loop accepts, reads and answers no other request: the "
        "requests in flight wait for each other's forwards, one at a time." + waited
    )
    ev = (
        th.evidence(
            "serve_loop_forward_warn",
            "event_loop_forward_share",
            round(share, 4),
            "ratio",
            ">=",
            "stacks",
        ),
        samples_evidence("event_loop_samples", split.samples, th),
    ) + tuple(
        Evidence(k, round(float(m[k]), 6), u, source=HK)
        for k, u in (("request_latency_p50_s", "s"), ("forward_time_p50_s", "s"))
        if m.get(k)
    )
    return _loop_finding(c, share, conf, msg, ev, split)


# Ray Serve runs a deployment's `def` methods in the replica's thread pool (its default since
# RAY_SERVE_RUN_SYNC_IN_THREADPOOL), its `async def` ones on the replica's event loop
RAY_ACTIONS = (
    "Ray Serve: declare the method `def`, not `async def` (Ray runs it in the replica's thread "
    "pool), or keep `async def` and `await asyncio.to_thread(...)` around the tokenizer and "
    "model calls",
    "or `@serve.batch` on the model call, so one forward serves the requests in flight (SERVE001)",
)
LOOP_ACTIONS = (
    "FastAPI/Starlette: declare the endpoint with `def`, not `async def` (it then runs in "
    "the thread pool), or keep `async def` and `await run_in_threadpool(...)` "
    "(starlette.concurrency) or `await asyncio.to_thread(...)` around the tokenizer and "
    "model calls",
    "another asyncio server (aiohttp, tornado, grpc.aio, a plain asyncio server): "
    "`await loop.run_in_executor(None, fn, ...)` (tornado: `IOLoop.current().run_in_executor`)",
    "or one model thread fed by a queue that batches the requests in flight (SERVE001)",
)


def _loop_finding(
    c: Context, share: float, conf: float, msg: str, ev: tuple, split: LoopSplit
) -> Finding:
    """SERVE004 with its hypothesis range: the loop's other work beside the forwards
    (1 / share), or the requests in flight with their forwards side by side in the thread
    pool, as far as the device has room (at least two): a public server's fix measured
    x1.03-1.26 where 1 / share said x1.07."""
    together = max(2.0, c.metrics.get("requests_in_flight_mean") or 0.0)
    high = max(1.0 / max(share, 1e-6), together)
    cpu = c.idle is None and not c.stats  # the forwards run on the CPU, holding the GIL
    low = CPU_THREAD_LOW if cpu else 1.0
    actions = RAY_ACTIONS if split.ray else LOOP_ACTIONS
    return new_finding(
        "SERVE004",
        c.th,
        confidence=conf,
        impact=1.0 - 1.0 / high,
        message=msg + " What it gives back is unverified until measured.",
        evidence=ev,
        recommendation=Recommendation(
            "Run the model off the event loop",
            ((RAY_CPU_ACTION if split.ray else CPU_ACTION,) if cpu else ()) + actions,
        ),
        expected_speedup=round(high, 3),
        location=split.where,
        signals=("stacks",),
        speedup_basis=f"a hypothesis, unverified: from x{low:.2f} "
        + (
            "(on a CPU a pool thread's forwards hold the GIL the loop needs: a small model's "
            "moved to a thread measured x0.57-0.67)"
            if cpu
            else "(the forwards still take their device one at a time)"
        )
        + f" to x{high:.2f} ({together:.1f} requests' forwards side by side "
        f"in the thread pool, and the loop's other work, {1 - share:.0%} of its time, beside "
        "them), as far as the device has room; measure it",
        speedup_kind="hypothesis",
        speedup_low=low,
    )


# SERVE004's fix on a CPU: the planted aiohttp server (a 1.5 ms forward of a small transformer,
# 4 clients, the 2-core box at load 0.4-0.7) served 548 and 575 req/s with the forward on its
# event loop, 340 and 365 with it moved to `asyncio.to_thread` (x0.59-0.67): the loop waits for
# the GIL the pool thread's forward holds. The planted tornado server (the same model, load
# 0.5-0.8): 645 and 662 req/s inline, 370 and 380 with `run_in_executor` (x0.57-0.58). A public
# FastAPI server's larger BERT measured x1.03-1.26 for the same fix on the same box.
# Processes, not threads, keep the loop's GIL.
CPU_THREAD_LOW = 0.55
CPU_ACTION = (
    "on a CPU, serve from several processes rather than a thread pool (uvicorn or gunicorn "
    "`--workers N`, aiohttp's `GunicornWebWorker`, tornado's `server.start(N)`, one process "
    "per core): a pool thread's forward holds the GIL the event loop needs"
)
RAY_CPU_ACTION = (
    "on a CPU, more replicas rather than threads (`@serve.deployment(num_replicas=N)`, one per "
    "core): a pool thread's forward holds the GIL the replica's event loop needs"
)


def find(c: Context) -> list[Finding]:
    """SERVE001, INFER001, INFER002, SERVE002, SERVE003 and SERVE004, from the analysis
    context."""
    return serve001(c) + infer001(c) + infer002(c) + serve002(c) + serve003(c) + serve004(c)


FINDER = Finder("serving", find, (SERVE001, INFER001, SERVE002, INFER002, SERVE003, SERVE004))
