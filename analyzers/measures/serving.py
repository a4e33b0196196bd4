"""The work of an inference loop or a server: the model's forwards and the requests, exactly
from the in-process hooks, and the requests in flight estimated from the stacks without them."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from gpudiag.analyzers.measures.rules import (
    Classifier,
    is_model_loading,
    parse_stack,
    user_location,
)
from gpudiag.analyzers.measures.triton import TRITON_UNITS, triton_metrics
from gpudiag.analyzers.measures.workload import FORWARD_FILE_RE, SERVER_FILE_RE, is_handling
from gpudiag.analyzers.model.results import Location
from gpudiag.analyzers.timeline.rollup import Rollup, ThreadKey
from gpudiag.analyzers.timeline.timeline import Aggregate

SERVING_UNITS = {
    "forwards": "count",
    "forwards_per_second": "1/s",
    "items_per_second": "items/s",
    "forward_batch_p50": "items",
    "forward_batch_max": "items",
    "forward_time_p50_s": "s",
    "forward_time_p95_s": "s",
    "forward_grad_share": "ratio",
    "forward_concurrency": "count",
    "requests": "count",
    "requests_per_second": "1/s",
    "request_latency_p50_s": "s",
    "request_latency_p95_s": "s",
    "request_latency_p99_s": "s",
    "requests_in_flight_mean": "count",
    "requests_in_flight_max": "count",
    "requests_in_flight_est": "count",
    "handler_forward_share": "ratio",
    "pool_forward_est": "count",
    "pool_busy_est": "count",
    "pool_threads": "count",
    "connections_open": "count",
    "connections_in_flight": "count",
    "connections_in_flight_max": "count",
    "connections_busy_share": "ratio",
    "connection_samples": "count",
    "padded_forwards": "count",
    "padding_share": "ratio",
    "padding_beyond_longest_share": "ratio",
    "padded_length_mean": "tokens",
    "longest_length_mean": "tokens",
    "real_length_mean": "tokens",
    "padded_length_sq_mean": "tokens^2",
    "longest_length_sq_mean": "tokens^2",
    "sorted_length_mean": "tokens",
    "sorted_length_sq_mean": "tokens^2",
    "sorted_rows": "items",
    "models_new": "count",
    "models_new_share": "ratio",
    "models_known": "count",
    "models_repeat_share": "ratio",
} | TRITON_UNITS


def _span_s(r: Rollup) -> float:
    if r.first_ns is None or r.last_ns is None:
        return 0.0
    return (r.last_ns - r.first_ns) / 1e9


def _rate(r: Rollup) -> float | None:
    """Events per second between the first and the last (None for fewer than 2)."""
    span = _span_s(r)
    return (r.count - 1) / span if r.count > 1 and span > 0 else None


def forward_metrics(tl: Aggregate) -> dict[str, float | None]:
    """Forwards/s, batch size per forward, forward time, autograd on: the hooks' forwards."""
    ft = tl.rollup("hooks", "forward_time_s", kind="forward")
    if ft is None or not ft.count:
        return {}
    batch = tl.rollup("hooks", "forward_batch", kind="forward")
    grad = tl.rollup("hooks", "forward_grad", kind="forward")
    span = _span_s(ft)
    b50 = batch.quantile(0.5) if batch else None
    return {
        "forwards": float(ft.count),
        "forwards_per_second": _rate(ft),
        "items_per_second": batch.total / span if batch and span > 0 else None,
        "forward_batch_p50": None if b50 is None else float(round(b50)),
        "forward_batch_max": batch.maximum if batch and batch.count else None,
        "forward_time_p50_s": ft.quantile(0.5),
        "forward_time_p95_s": ft.quantile(0.95),
        "forward_grad_share": grad.mean if grad else None,
        # forwards running at once on average (Little's law: busy time over the span)
        "forward_concurrency": ft.total / span if span > 0 else None,
    }


PAD_SERIES = ("rows", "tokens", "real_tokens", "longest_tokens", "sq_tokens", "longest_sq_tokens")


def padding_metrics(tl: Aggregate) -> dict[str, float | None]:
    """How much of what the forwards computed was padding: their attention masks' rows as
    padded, each batch's longest, real (tokens a row, and squared: attention's cost), and
    the last kept rows sorted by length and batched as the job batches (the hooks' rows)."""
    got = [tl.rollup("hooks", f"pad_{n}", kind="padding") for n in PAD_SERIES]
    totals = [r.total for r in got if r is not None]
    if len(totals) < len(PAD_SERIES) or totals[0] <= 0 or totals[1] <= 0:
        return {}
    rows, tokens, real, longest, square, longest_sq = totals
    return {
        "padded_forwards": float(got[1].count) if got[1] is not None else None,
        "padding_share": 1.0 - real / tokens,
        "padding_beyond_longest_share": 1.0 - longest / tokens,
        "padded_length_mean": tokens / rows,
        "longest_length_mean": longest / rows,
        "real_length_mean": real / rows,
        "padded_length_sq_mean": square / rows,
        "longest_length_sq_mean": longest_sq / rows,
    } | sorted_padding(tl)


def sorted_padding(tl: Aggregate) -> dict[str, float | None]:
    """The row length (and its square) the last kept rows pad to when sorted by length and
    batched as the job batches: the hooks' latest summary."""
    n = tl.rollup("hooks", "pads_rows", kind="padding_sorted")
    tokens = tl.rollup("hooks", "pads_tokens", kind="padding_sorted")
    square = tl.rollup("hooks", "pads_sq_tokens", kind="padding_sorted")
    if n is None or tokens is None or square is None or not n.last:
        return {}
    return {
        "sorted_length_mean": (tokens.last or 0.0) / n.last,
        "sorted_length_sq_mean": (square.last or 0.0) / n.last,
        "sorted_rows": n.last,
    }


def model_metrics(tl: Aggregate) -> dict[str, float | None]:
    """How many top modules ran a first forward (the hooks: a server's one model gives one; a
    model built per request, one a request), their share of the forwards, and of those whose
    source the hooks knew, the share loaded from a source seen before."""
    new = tl.rollup("hooks", "model_new", kind="model")
    ft = tl.rollup("hooks", "forward_time_s", kind="forward")
    if new is None or not new.count:
        return {}
    out: dict[str, float | None] = {
        "models_new": float(new.count),
        "models_new_share": new.count / ft.count if ft is not None and ft.count else None,
    }
    known = tl.rollup("hooks", "model_known", kind="model")
    repeat = tl.rollup("hooks", "model_repeat", kind="model")
    if known is not None and known.total >= 1 and repeat is not None:
        out["models_known"] = known.total
        out["models_repeat_share"] = repeat.total / known.total
    return out


def loads_other_models(m: dict, th_min: float = 3.0) -> bool:
    """Whether the models loaded again and again are different ones (a sweep over
    checkpoints: each load is the job's work, not one to keep): the hooks knew where `th_min`
    or more came from, and fewer than half came from a place seen before."""
    known, repeat = m.get("models_known"), m.get("models_repeat_share")
    return known is not None and known >= th_min and repeat is not None and repeat < 0.5


def request_metrics(tl: Aggregate) -> dict[str, float | None]:
    """Requests/s, latency percentiles and requests in flight: the hooks' requests."""
    rl = tl.rollup("hooks", "request_latency_s", kind="request")
    if rl is None or not rl.count:
        return {}
    inflight = tl.rollup("hooks", "request_in_flight", kind="request")
    span = _span_s(rl)
    return {
        "requests": float(rl.count),
        "requests_per_second": _rate(rl),
        "request_latency_p50_s": rl.quantile(0.5),
        "request_latency_p95_s": rl.quantile(0.95),
        "request_latency_p99_s": rl.quantile(0.99),
        "requests_in_flight_mean": rl.total / span if span > 0 else None,
        "requests_in_flight_max": inflight.maximum if inflight and inflight.count else None,
    }


def request_forward_share(m: dict) -> float | None:
    """The share of a request's time spent in the model's forward: forwards running at once
    over requests in flight (Little's law on the hooks' timings), else the stacks' share."""
    fc, inflight = m.get("forward_concurrency"), m.get("requests_in_flight_mean")
    if fc is not None and inflight:
        return min(1.0, fc / inflight)
    return m.get("handler_forward_share")


def forward_busy_share(m: dict, kind: str) -> float | None:
    """The share of the work in the model's forwards: of a request's time for a server, of
    the loop's for an inference loop (forwards running at once, the hooks' timings)."""
    return request_forward_share(m) if kind == "server" else m.get("forward_concurrency")


def handler_metrics(tl: Aggregate) -> dict[str, float | None]:
    """From the stacks: requests in flight (request-handler samples per py-spy tick, the
    listener's wait left out) and the share of handler time in the model's forward."""
    w = tl.windows.get("all")
    if w is None or w.ticks <= 0:
        return {}
    handling = forward = 0.0
    for key in tl.threads("all", "target"):
        for (stack, _code), n in tl.stacks[key].items():
            if is_handling(stack):
                handling += n
                forward += n * any(FORWARD_FILE_RE.search(fr.file) for fr in parse_stack(stack))
    if handling <= 0:
        return {}
    return {
        "requests_in_flight_est": handling / w.ticks,
        "handler_forward_share": forward / handling,
    }


# A thread pool's work item: the model run off the request's thread, one call a request (the
# pool runs the handler's function per request): concurrent.futures' workers
# (`loop.run_in_executor`, `asyncio.to_thread`, a `ThreadPoolExecutor`'s `submit`) and
# anyio's (Starlette's `run_in_threadpool`: FastAPI's `def` endpoints, BentoML's sync APIs)
POOL_WORK_RE = re.compile(r"/concurrent/futures/thread\.py$|/anyio/_backends/_asyncio\.py$")
# A batcher's own frames on any thread: a call then carries the requests it gathered
# (BentoML's adaptive batching dispatcher, Ray Serve's @serve.batch, LitServe's batched loop)
BATCHER_RE = re.compile(r"/bentoml/_internal/[m]arshal/|/ray/serve/batching\.py$")
BATCHER_FUNC_RE = re.compile(r"(^|\.)run_batched_loop$")


def _pool_forward(frames: tuple) -> bool:
    """A pool thread's sample in the model's forward, under the pool's work item."""
    return any(POOL_WORK_RE.search(fr.file) for fr in frames) and any(
        FORWARD_FILE_RE.search(fr.file) for fr in frames
    )


def batcher_seen(tl: Aggregate) -> bool:
    """Whether any thread's stacks pass through a known batcher."""
    return any(
        BATCHER_RE.search(fr.file) or BATCHER_FUNC_RE.search(fr.function)
        for key in tl.threads("all", "target")
        for (stack, _code) in tl.stacks[key]
        for fr in parse_stack(stack)
    )


def pool_metrics(tl: Aggregate) -> dict[str, float | None]:
    """From the stacks: the model run on pool threads apart from the request's (no request
    frames on them), one call a request. Forwards running at once on them (forward samples
    per tick) and calls in progress (their samples not waiting for work, per tick): each is
    one request in flight. Empty where no pool thread runs the model, or a batcher is seen."""
    w = tl.windows.get("all")
    if w is None or w.ticks <= 0:
        return {}
    forward = busy = 0.0
    threads = 0
    for key in tl.threads("all", "target"):
        rows = [(parse_stack(s), s, code, n) for (s, code), n in tl.stacks[key].items()]
        if not any(_pool_forward(frames) for frames, *_ in rows):
            continue
        if any(is_handling(s) for _f, s, _c, _n in rows):
            continue  # the request's own thread: handler_metrics counts it
        threads += 1
        for frames, s, code, n in rows:
            forward += n * _pool_forward(frames)
            # the pool's own frame innermost: waiting for work (a SimpleQueue's get, in C)
            idle = Classifier.is_waiting(s, code) or bool(POOL_WORK_RE.search(frames[-1].file))
            busy += n * (not idle)
    if threads == 0 or forward <= 0 or batcher_seen(tl):
        return {}
    return {
        "pool_forward_est": forward / w.ticks,
        "pool_busy_est": busy / w.ticks,
        "pool_threads": float(threads),
    }


def connection_metrics(tl: Aggregate) -> dict[str, float | None]:
    """From the kernel's socket table (the conns probe): the connections open on the job's
    listening ports, those awaiting an answer (requests in flight, the server's whole: those
    an event loop holds on no thread's stack included) on average, and the share of the
    readings with at least one."""
    inflight = tl.rollup("conns", "in_flight")
    if inflight is None or not inflight.count:
        return {}
    opened, busy = tl.rollup("conns", "open"), tl.rollup("conns", "busy")
    return {
        "connections_open": opened.mean if opened else None,
        "connections_in_flight": inflight.mean,
        "connections_in_flight_max": inflight.maximum,
        "connections_busy_share": busy.mean if busy else None,
        "connection_samples": float(inflight.count),
    }


MIN_CONN_SAMPLES = 20  # readings of the connections before their requests in flight count


def in_flight_by_kernel(m: dict) -> tuple[float, float] | None:
    """(requests in flight on average over the look, and while any was) from the kernel's
    connections; None on too few readings or none in flight."""
    mean, busy = m.get("connections_in_flight"), m.get("connections_busy_share")
    if mean is None or not busy or (m.get("connection_samples") or 0) < MIN_CONN_SAMPLES:
        return None
    return mean, mean / busy


def serving_metrics(tl: Aggregate) -> dict[str, float | None]:
    """Every serving metric there is signal for (empty for a job with none); a Triton
    server's requests are its own counters' (its queue is in C++, before any hook)."""
    return (
        forward_metrics(tl)
        | padding_metrics(tl)
        | model_metrics(tl)
        | request_metrics(tl)
        | handler_metrics(tl)
        | pool_metrics(tl)
        | connection_metrics(tl)
        | triton_metrics(tl)
    )


POOLED_TID = 0  # the pooled request handlers' thread id in a profile (no real thread has it)


def handler_keys(view: Aggregate) -> list[ThreadKey]:
    """The request-handler threads: those with a stack sample inside a request."""
    return [
        k for k in view.threads("all", "target") if any(is_handling(s) for s, _ in view.stacks[k])
    ]


def handler_names(view: Aggregate) -> frozenset[str]:
    """The names of the request path's threads: those seen inside a request or in the model's
    forward (a batcher, `asyncio.to_thread`'s workers), in any window (the --gil window's
    included: a short-lived handler thread may be caught only there)."""
    keys = view.threads("all", "target") + view.threads("gil", "target")
    return frozenset(
        k.thread for k in keys if k.thread and any(_on_path(s) for s, _ in view.stacks[k])
    )


def _on_path(stack: str) -> bool:
    return is_handling(stack) or any(FORWARD_FILE_RE.search(fr.file) for fr in parse_stack(stack))


def pool_handlers(view: Aggregate) -> Aggregate | None:
    """The view with every request-handler thread's stacks pooled into one thread, "request
    handlers (N threads)"; None when no thread handles requests. The series are shared."""
    keys = handler_keys(view)
    if not keys:
        return None
    merged: dict[tuple[str, str], float] = {}
    for k in keys:
        for sk, n in view.stacks[k].items():
            merged[sk] = merged.get(sk, 0.0) + n
    out = copy.copy(view)
    out.stacks = {k: v for k, v in view.stacks.items() if k not in keys}
    name = f"request handlers ({len(keys)} threads)"
    out.stacks[ThreadKey("all", "target", POOLED_TID, name)] = merged
    return out


# The server's own socket I/O on the request path (sending the answer, closing): waiting on
# the network or for the GIL back after a send, not work the handler could move elsewhere.
# gRPC's sync server does its own in grpc/_server.py (receiving the request, sending the
# answer and status through gRPC core's start_server_batch).
SOCKET_IO_RE = re.compile(r"/(socketserver|socket|ssl|selectors)\.py$|/grpc/_server\.py$")
# ...and its own system calls made from a server's Python (the executing line of the innermost
# frame): gunicorn's `sock.sendall(data)` in its util.write, the `os.write` that wakes its
# poller, the `os.utime` of its heartbeat: a gunicorn worker's answers read as 54% host work.
SOCKET_IO_CODE_RE = re.compile(
    r"\.(sendall|send|sendfile|recv|recv_into|settimeout)\(|\bos\.(write|read|utime|fchmod)\("
)


@dataclass(frozen=True)
class HandlerSplit:
    """Request-handler stack samples by what they do: the model's forward, waiting or socket
    I/O, and host work (on the CPU outside the model), with host work's top user locations."""

    samples: float
    forward: float  # on the handlers
    waiting: float
    host: float
    top: tuple[tuple[Location, float], ...]  # (user location, share of the busy samples)
    model: float = 0.0  # forward samples on any thread (a batcher's included)
    framework: float = 0.0  # on the CPU in the server framework's own per-request work
    loading: float = 0.0  # on the handlers, loading a model or its weights
    load_top: Location | None = None  # the job's line that loads it, seen most

    @property
    def busy(self) -> float:
        """The request path's busy samples: the model's forwards, the handlers' own work, the
        server framework's and the models the handlers load."""
        return self.host + self.framework + self.model + self.loading


# The server framework's own per-request work, not the app's: a host sample whose innermost
# frame of the app or of a server framework (other libraries and the standard library passed
# over) is the framework's: its parser, routing, headers, the answer's framing (gunicorn,
# Werkzeug, Flask, Starlette, FastAPI, uvicorn, http.server...), and gevent's or eventlet's
# timeouts and socket wrappers around them.
FRAMEWORK_FILE_RE = re.compile(SERVER_FILE_RE.pattern + r"|/(gevent|eventlet)/")


def is_framework_work(frames: tuple) -> bool:
    """Whether a request handler's host sample is the server framework's own work."""
    for fr in reversed(frames):
        # a framework installed outside site-packages (pip --target, a vendored copy) is
        # still the framework: its folder names it before its path calls it the job's own
        if FRAMEWORK_FILE_RE.search(fr.file):
            return True
        if fr.is_user:
            return False
    return False


def handler_split(view: Aggregate, clf: Classifier) -> HandlerSplit | None:
    """The request handlers' samples split (None when no thread handles requests)."""
    total = fwd = wait = host = model = framework = loading = 0.0
    where: dict[Location, float] = {}
    loads: dict[Location, float] = {}
    for key in view.threads("all", "target"):
        for (stack, code), n in view.stacks[key].items():
            frames = parse_stack(stack)
            load = is_model_loading(frames)
            in_model = not load and any(FORWARD_FILE_RE.search(fr.file) for fr in frames)
            model += n * in_model
            if not is_handling(stack):
                continue
            total += n
            if load:
                loading += n
                fr = user_location(stack)
                if fr is not None:
                    loc = Location(fr.file, fr.line, fr.function)
                    loads[loc] = loads.get(loc, 0.0) + n
            elif in_model:
                fwd += n
            elif (
                clf.is_waiting(stack, code)
                or clf.is_blocking_call(stack, code)
                or SOCKET_IO_RE.search(frames[-1].file)
                or SOCKET_IO_CODE_RE.search(code)
            ):
                wait += n
            elif is_framework_work(frames):
                framework += n
            else:
                host += n
                fr = user_location(stack)
                if fr is not None:
                    loc = Location(fr.file, fr.line, fr.function)
                    where[loc] = where.get(loc, 0.0) + n
    if total <= 0 or host + framework + model + loading <= 0:
        return None
    busy = host + framework + model + loading
    top = tuple((loc, n / busy) for loc, n in sorted(where.items(), key=lambda x: -x[1])[:3])
    load_top = max(loads, key=lambda k: loads[k]) if loads else None
    return HandlerSplit(total, fwd, wait, host, top, model, framework, loading, load_top)


# An asyncio event loop (asyncio's or uvloop's) on the thread: the coroutines of an ASGI or
# grpc.aio server run on it, one at a time.
EVENT_LOOP_RE = re.compile(r"/asyncio/(base_events|events)\.py$|/uvloop/")
# ...or a thread whose event loop runs in C (uvloop) below a known runner: Ray Serve's
# replica runs the user's code so
EVENT_LOOP_FUNC_RE = re.compile(r"(^|\.)_run_user_code_event_loop$")


@dataclass(frozen=True)
class LoopSplit:
    """Stack samples of the job's event-loop threads, those in the model's forward, and the
    job's own call into the model seen most (None when no user frame called it)."""

    samples: float
    forward: float
    where: Location | None
    ray: bool = False  # the loop is a Ray Serve replica's


def _model_caller(frames: tuple) -> Location | None:
    """The innermost frame of the job's own code that called the model's forward."""
    first = next(i for i, fr in enumerate(frames) if FORWARD_FILE_RE.search(fr.file))
    for fr in reversed(frames[:first]):
        if fr.is_user and fr.file and fr.line > 0:
            return Location(fr.file, fr.line, fr.function)
    return None


def event_loop_split(view: Aggregate) -> LoopSplit | None:
    """How much of the event-loop threads' time the model's forwards take (None: no event
    loop seen): a forward there holds up every other coroutine of the server."""
    total = fwd = ray = 0.0
    where: dict[Location, float] = {}
    for key in view.threads("all", "target"):
        for (stack, _code), n in view.stacks[key].items():
            frames = parse_stack(stack)
            if not any(
                EVENT_LOOP_RE.search(fr.file) or EVENT_LOOP_FUNC_RE.search(fr.function)
                for fr in frames
            ):
                continue
            total += n
            ray += n * any("/ray/serve/" in fr.file for fr in frames)
            if any(FORWARD_FILE_RE.search(fr.file) for fr in frames):
                fwd += n
                loc = _model_caller(frames)
                if loc is not None:
                    where[loc] = where.get(loc, 0.0) + n
    if total <= 0:
        return None
    top = max(where, key=lambda k: where[k]) if where else None
    return LoopSplit(total, fwd, top, ray >= total / 2)
