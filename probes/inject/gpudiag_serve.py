"""In-process hooks of inference and serving: the model's outermost forwards (a global
forward hook) and the requests of a standard-library or Werkzeug HTTP server, of gunicorn's
workers (sync, gthread, gevent/eventlet, its ASGI worker; in each forked worker), of an ASGI
app (uvicorn's request cycle, Starlette/FastAPI's app call), of aiohttp's or tornado's web
server, or the RPCs of grpcio's sync and asyncio servers, buffered for gpudiag_hooks to send
with the steps.

Runs inside the job and imports nothing from gpudiag. It only observes: no hook changes a
forward's inputs or outputs or a request's answer, every install step is guarded, and a
failure inside a hook is swallowed (an exception never reaches the job's code). The forward
hooks come out at the job's first optimizer step (a training job keeps today's hooks and their
cost) and when hooks loaded by `attach --hooks` go quiet (a later attach puts them back): a
global forward hook, even one that returns at once, takes every module call off torch's fast
path (a small 8-layer model ran 45-80% slower with them left behind).
"""

from __future__ import annotations

import _socket
import contextvars
import re
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

try:
    from . import gpudiag_padding as _padding
except ImportError:  # loaded as a top-level module by sitecustomize
    import gpudiag_padding as _padding

MAX_ROWS = 20000  # forwards or requests kept between two flushes; more are dropped
SO_TIMESTAMPNS = 35  # Linux: stamp each received packet with the kernel's receive time
MAX_QUEUED_S = 60.0  # an arrival stamp older than this is not believed

# Requests that are not the model's traffic: health, liveness and readiness checks (a
# Kubernetes probe, Ray Serve's `/-/healthz` and `/-/routes`, Triton's `/v2/health/...`) and
# metrics scrapes. Not timed: one every few seconds stretches the span of the requests and
# takes the rate and the latency percentiles away from the clients'.
PROBE_PATH_RE = re.compile(
    r"^/(?:-/)?(?:healthz?|livez?|readyz?|ready|ping|metrics|routes|v2/health/(?:ready|live))/?$"
)


# ...and the gRPC services that are not: gRPC's health checks and reflection, telemetry
# received over OTLP (Ray's dashboard agent collects its processes' metrics so, every few
# seconds), Ray's own control plane
PROBE_RPC_RE = re.compile(
    r"^/(?:grpc\.health\.v1\.Health/|grpc\.reflection\.|opentelemetry\.proto\.collector\."
    r"|ray\.rpc\.)"
)


def is_probe_rpc(method: object) -> bool:
    """Whether a gRPC method ('/package.Service/Method') is a health check or a server's own
    control-plane call, not the model's traffic."""
    if isinstance(method, bytes):
        method = method.decode("latin-1")
    return isinstance(method, str) and bool(PROBE_RPC_RE.match(method))


def is_probe(path: object) -> bool:
    """Whether a request's path (its query left out) is a health check or a metrics scrape."""
    if isinstance(path, bytes):
        path = path.decode("latin-1")
    return isinstance(path, str) and bool(PROBE_PATH_RE.match(path.split("?", 1)[0]))


def stamp_arrivals(sock: Any) -> None:
    """Ask the kernel to stamp `sock`'s received data (a listener passes it on to the
    connections it accepts; a listener keeping it on keeps the stamps taken between
    connections)."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def _peek_stamp(sock: Any) -> float | None:
    """The Unix time the first unread byte of `sock` reached the kernel, peeked without
    reading it or waiting for it (None: no data yet, or no stamp)."""
    fd = sock.fileno()
    if fd < 0:
        return None
    # a plain socket on the same descriptor: an SSL or asyncio wrapper refuses recvmsg, and
    # gevent's (socket.socket once it patched it) waits for data instead of saying "none yet"
    raw = _socket.socket(fileno=fd)
    try:
        _, anc, _, _ = raw.recvmsg(1, 64, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return None
    finally:
        raw.detach()
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec + nsec * 1e-9
    return None


def arrived_at(sock: Any, fallback: float) -> float:
    """When (perf_counter) the request waiting on the just-accepted `sock` reached the
    kernel: the client's send, on loopback or a LAN, before the server's listener got the
    GIL (or its event loop a turn) to accept it; `fallback` when not known or later."""
    try:
        stamp_arrivals(sock)
        sent = _peek_stamp(sock)
    except Exception:
        return fallback
    if sent is None:
        return fallback
    queued = time.time() - sent
    if not 0.0 <= queued <= MAX_QUEUED_S:
        return fallback
    return min(fallback, time.perf_counter() - queued)


SOURCE_MODULES = 64  # submodules looked through for where a model was loaded from
# a training job's forwards: one attention mask counted this often at most (a CPU mask's sum
# takes microseconds; a GPU mask's is read without a sync, one in gpudiag_padding.GPU_EVERY)
TRAIN_MASK_EVERY_S = 0.05


def model_source(module: Any) -> str | None:
    """Where a model was loaded from: its class and the `name_or_path` of it or of a module
    inside it (Hugging Face's models; sentence-transformers' holds one); None when no module
    says (a model built in code, or from torch.load)."""
    try:
        for i, sub in enumerate(module.modules()):
            path = getattr(sub, "name_or_path", None)
            if isinstance(path, str) and path:
                return f"{type(module).__qualname__}|{path}"
            if i >= SOURCE_MODULES:
                break
    except Exception:
        pass
    return None


class Recorder:
    """Forwards and requests since the last flush; `due()` is called after each one."""

    def __init__(self, due: Callable[[], object]) -> None:
        self.lock = threading.Lock()
        self.forwards: list[list[float]] = []  # [end (Unix s), seconds, batch, grad on]
        self.requests: list[list[float]] = []  # [end (Unix s), seconds, in flight at start]
        self.padding = _padding.Padding(MAX_ROWS)  # the forwards' attention masks
        self.models: weakref.WeakSet = weakref.WeakSet()  # the top modules seen forwarding
        # [Unix s, 1, source known, source seen before]: a top module's first forward
        self.new_models: list[list[float]] = []
        self.sources: set[str] = set()  # where the new models were loaded from
        self.local = threading.local()
        self.in_flight = 0
        self.accepted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # socket: t
        self.handles: list = []  # our global hooks still registered (install_forwards)
        self.forward_handles: tuple = ()  # the forward pre and post hooks, while registered
        self.training: Any = None  # the optimizer pre-hook: forwards out at the first step
        self.trained = False  # an optimizer step was seen: forwards are no longer recorded
        self.mask_handles: list = []  # a training job's models' own pre-hooks (watch_masks)
        self.last_mask = 0.0  # when a training forward's mask was last counted (monotonic)
        self.quiet = False  # the agent is gone (attach --hooks): nothing recorded
        self.torch: Any = None
        self.due = due

    def take(self) -> tuple[list, list]:
        """The rows buffered so far, handed over once."""
        with self.lock:
            f, r = self.forwards, self.requests
            self.forwards, self.requests = [], []
        return f, r

    def put_back(self, forwards: list, requests: list) -> None:
        """Rows `take` handed over that could not be sent, kept ahead of the newer ones (at
        most MAX_ROWS each: the oldest go first)."""
        with self.lock:
            self.forwards = (forwards + self.forwards)[-MAX_ROWS:]
            self.requests = (requests + self.requests)[-MAX_ROWS:]

    def take_extra(self) -> dict[str, list[list[float]]]:
        """The rows sent in datagrams of their own, handed over once: the forwards' padding
        ("pad"), the sorted-batches summary when one is due ("pads"), and the first forwards
        of top modules not seen before ("mdl")."""
        pad, summary = self.padding.take()
        with self.lock:
            mdl, self.new_models = self.new_models, []
        return {"pad": pad, "pads": summary, "mdl": mdl}

    def note_model(self, module: Any) -> None:
        """A top module's forward: a row when it is one never seen before (a model built per
        request shows one a request; a server's one model, one in all), with whether where it
        was loaded from is known and was seen before (the same model loaded again, or a sweep
        over different ones)."""
        try:
            if module in self.models:
                return
            self.models.add(module)
        except TypeError:  # not weak-referenceable or hashable: not counted
            return
        source = model_source(module)
        with self.lock:
            again = source in self.sources
            if source is not None and len(self.sources) < MAX_ROWS:
                self.sources.add(source)
            if len(self.new_models) < MAX_ROWS:
                self.new_models.append([time.time(), 1.0, float(source is not None), float(again)])

    def count_padding(self, module: Any, args: tuple, kwargs: dict | None, end: float) -> None:
        """Count the padding of a forward's attention mask, if it was given one."""
        if self.quiet:
            return
        mask = _padding.attention_mask(args, kwargs, module)
        if mask is not None:
            self.padding.count(self.torch, mask, end)

    def add(self, rows: list, row: list[float]) -> None:
        if self.quiet:
            return
        with self.lock:
            if len(rows) < MAX_ROWS:
                rows.append(row)
        self.due()

    def start_request(self, conn: Any) -> tuple[float, float]:
        """(start, in flight): a connection's first request starts when it was accepted."""
        now = time.perf_counter()
        with self.lock:
            self.in_flight += 1
            try:
                t0 = self.accepted.pop(conn, now)
            except TypeError:  # not a socket
                t0 = now
            return t0, float(self.in_flight)

    def accept(self, conn: Any, t: float) -> None:
        """`conn` was waiting to be accepted at `t` (perf_counter)."""
        with self.lock:
            if len(self.accepted) < 4096:
                self.accepted[conn] = t

    def end_request(
        self, t0: float, in_flight: float, sent: float | None = None, path: Any = None
    ) -> None:
        """A request started at `t0` is done; its answer left at `sent` (perf_counter; now
        when not known). A health check or metrics scrape (`path`) is not kept."""
        with self.lock:
            self.in_flight = max(0, self.in_flight - 1)
        if is_probe(path):
            return
        now = time.perf_counter()
        end = now if sent is None or not t0 <= sent <= now else sent
        self.add(self.requests, [time.time() - (now - end), end - t0, in_flight])

    def after_fork(self) -> None:
        """In a forked child (a gunicorn worker, a multiprocessing worker): a lock another
        thread of the parent held at the fork would be held for ever, and the parent's buffered
        rows are the parent's to send; start empty, with no request in flight."""
        self.lock = threading.Lock()
        self.forwards, self.requests = [], []
        self.padding.clear()
        self.models, self.new_models, self.sources = weakref.WeakSet(), [], set()
        self.local = threading.local()
        self.in_flight = 0
        self.accepted = weakref.WeakKeyDictionary()


def _items(v: Any) -> tuple:
    """The values to look into for a tensor: a list's or tuple's items, a mapping's values
    (Hugging Face models take a dict or a BatchEncoding of tensors), else the value itself."""
    if isinstance(v, (list, tuple)):
        return tuple(v)
    if isinstance(v, Mapping):
        return tuple(v.values())
    return (v,)


def batch_size(args: tuple, kwargs: dict | None) -> float:
    """The first dimension of the first tensor among the inputs (0 when there is none)."""
    values = list(args) + list((kwargs or {}).values())
    for v in values:
        for item in _items(v):
            shape = getattr(item, "shape", None)
            if shape is not None and hasattr(item, "dtype"):
                return float(shape[0]) if len(shape) else 1.0
    return 0.0


def first_parameter(module):
    """The module's first parameter; None for a module without any (torchvision's
    transforms, activations, pooling): its call is not a model's forward."""
    try:
        return next(module.parameters(), None)
    except Exception:
        return None


def _forward_hooks(torch: Any, rec: Recorder) -> Any:
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    def pre(module, args):
        try:
            if rec.quiet or rec.trained or compiling():
                return None
            loc = rec.local
            depth = getattr(loc, "depth", 0)
            if depth == 0:  # the outermost module: one forward of the model
                param = first_parameter(module)
                if param is None:  # a transform or another parameter-less module
                    return None
                loc.t0 = time.perf_counter()
                loc.grad = 1.0 if torch.is_grad_enabled() and param.requires_grad else 0.0
                rec.note_model(module)
            loc.depth = depth + 1
        except Exception:
            pass
        return None

    def post(module, args, *rest):
        # (kwargs, output); torch calls an always_call hook with (output,) alone when the
        # forward raised
        try:
            kwargs = rest[0] if len(rest) == 2 else None
            if rec.quiet or rec.trained or compiling():
                return None
            loc = rec.local
            loc.depth = max(0, getattr(loc, "depth", 1) - 1)
            if loc.depth == 0 and getattr(loc, "t0", None) is not None:
                took = time.perf_counter() - loc.t0
                row = [time.time(), took, batch_size(args, kwargs), loc.grad]
                loc.t0 = None
                rec.count_padding(module, args, kwargs, row[0])
                rec.add(rec.forwards, row)
        except Exception:
            pass
        return None

    return pre, post


def install_forwards(torch: Any, rec: Recorder) -> None:
    """Global forward hooks on every nn.Module, counting the outermost call of each thread;
    taken out at the first optimizer step (`take_out_forwards`)."""
    from torch.nn.modules import module as nn_module

    rec.torch = torch
    pre, post = _forward_hooks(torch, rec)
    h_pre = nn_module.register_module_forward_pre_hook(pre)
    rec.handles.append(h_pre)
    try:
        h = nn_module.register_module_forward_hook(post, with_kwargs=True, always_call=True)
    except TypeError:  # an older torch: no always_call (a forward that raises is not timed)
        h = nn_module.register_module_forward_hook(post, with_kwargs=True)
    rec.handles.append(h)
    rec.forward_handles = (h_pre, h)
    if rec.training is not None:
        return  # put back by a wake: the first step's hook is still there
    from torch.optim import optimizer

    def training(opt, args, kwargs):
        try:
            rec.trained = True  # a training job: its forwards are not recorded any more
            out = take_out_forwards(rec)
            watch_masks(torch, rec)
            h_train, hooks = rec.training, optimizer._global_optimizer_pre_hooks
            # torch is walking `hooks` (this call is in its loop): only the last one may
            # leave, the walk then ends as it would have (another would break its next turn);
            # and only once the forward hooks are out (a `try` arm's forward clock is in until
            # its first step ends: ours stayed in every module call of the arm for good)
            if out and h_train is not None and next(reversed(hooks), None) == h_train.id:
                h_train.remove()
                rec.training = None
                rec.handles.remove(h_train)
        except Exception:
            pass

    rec.training = optimizer.register_optimizer_step_pre_hook(training)
    rec.handles.append(rec.training)


def watch_masks(torch: Any, rec: Recorder) -> None:
    """A training job: the models seen forwarding keep a pre-hook of their own that counts an
    attention mask every TRAIN_MASK_EVERY_S at most (padding costs a training step's forward
    and backward alike); the global forward hooks are out, so nothing else is recorded."""
    if rec.mask_handles:
        return
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    def pre(module, args, kwargs):
        try:
            now = time.monotonic()
            if rec.quiet or now - rec.last_mask < TRAIN_MASK_EVERY_S or compiling():
                return None
            rec.last_mask = now
            rec.count_padding(module, args, kwargs, time.time())
        except Exception:
            pass
        return None

    for model in list(rec.models)[:8]:
        try:
            rec.mask_handles.append(model.register_forward_pre_hook(pre, with_kwargs=True))
        except Exception:  # an older torch (no with_kwargs), or not a module after all
            pass


def take_out_forwards(rec: Recorder) -> bool:
    """Take the global forward hooks out, giving torch's fast path back; whether they are out.

    torch calls forward hooks from a copy, except when a forward raised: then it walks the
    post-hook dict itself (in any thread), and an entry taken out ahead of a walk breaks its
    next turn (a RuntimeError in the job). So ours leaves only when it is the dict's one
    entry (a walk has then passed it: nothing is left to break); when the job has global
    forward hooks of its own, ours stays in and returns at once (`rec.quiet`, `rec.trained`),
    torch's slow path being the job's anyway."""
    if not rec.forward_handles:
        return True
    from torch.nn.modules import module as nn_module

    h_pre, h_post = rec.forward_handles
    if set(nn_module._global_forward_hooks) - {h_post.id}:
        return False
    h_post.remove()
    # torch's remove() leaves the with_kwargs flag behind (torch.compile then still sees a
    # global hook); only ever looked up by key
    getattr(nn_module, "_global_forward_hooks_with_kwargs", {}).pop(h_post.id, None)
    h_pre.remove()  # pre-hooks are only ever called from a copy
    rec.forward_handles = ()
    rec.handles = [h for h in rec.handles if h is not h_pre and h is not h_post]
    return True


def go_quiet(rec: Recorder) -> None:
    """The agent is gone (attach --hooks): record nothing, forward hooks out where safe."""
    rec.quiet = True
    rec.take()
    rec.take_extra()
    rec.padding.clear()
    take_out_forwards(rec)


def wake(rec: Recorder) -> None:
    """A new agent attached: record again; forward hooks back unless the job trains."""
    if rec.quiet:
        rec.local = threading.local()  # a forward half seen while quiet counts from scratch
    rec.quiet = False
    if not rec.trained and not rec.forward_handles and rec.torch is not None:
        install_forwards(rec.torch, rec)


class SentClock:
    """A request handler's `wfile`, passed through, noting when its last write began: the
    answer's bytes leave then, and the handler's return after can wait for the GIL (up to a
    switch interval on a busy server) while its client already has the answer. A large
    answer to a slow client is timed to its last write's start."""

    def __init__(self, raw: Any) -> None:
        self._gpudiag_raw = raw
        self.gpudiag_sent: float | None = None

    def write(self, data):
        self.gpudiag_sent = time.perf_counter()
        return self._gpudiag_raw.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gpudiag_raw, name)


def _clock_writes(handler: Any) -> None:
    """Put a SentClock around the handler's wfile once a connection; its last write forgotten."""
    wfile = getattr(handler, "wfile", None)
    if wfile is None:
        return
    if not isinstance(wfile, SentClock):
        handler.wfile = wfile = SentClock(wfile)
    wfile.gpudiag_sent = None


def _sent(handler: Any) -> float | None:
    wfile = getattr(handler, "wfile", None)
    return wfile.gpudiag_sent if isinstance(wfile, SentClock) else None


def patch_handler(cls: Any, rec: Recorder) -> None:
    """Time each request of an http.server-style handler class: from its connection accepted
    (a connection's first request; later ones from parse_request) to its answer's last write
    (else the end of handle_one_request)."""
    if cls.__dict__.get("_gpudiag_patched"):
        return
    orig_parse, orig_one = cls.parse_request, cls.handle_one_request

    def parse_request(self):
        try:
            if getattr(self, "_gpudiag_t0", None) is None:
                self._gpudiag_t0 = rec.start_request(getattr(self, "request", None))
                _clock_writes(self)
        except Exception:
            pass
        return orig_parse(self)

    def handle_one_request(self):
        try:
            self._gpudiag_t0 = None
        except Exception:
            pass
        try:
            return orig_one(self)
        finally:
            try:
                started: tuple[float, float] | None = getattr(self, "_gpudiag_t0", None)
                if started is not None:
                    self._gpudiag_t0 = None
                    rec.end_request(*started, _sent(self), getattr(self, "path", None))
            except Exception:
                pass

    cls.parse_request, cls.handle_one_request = parse_request, handle_one_request
    cls._gpudiag_patched = True


def _patch_socketserver(module: Any, rec: Recorder) -> None:
    """The time each connection waits to be accepted from: its request's arrival in the
    kernel (`arrived_at`), else TCPServer.get_request's call, in the listener, once its
    select said one was pending (accept()'s return waits for the GIL again: up to a switch
    interval on a busy server, which the client sees). The listening socket is asked to
    stamp arrivals at its first accept: the connections after it inherit the stamps."""
    cls = module.TCPServer
    if cls.__dict__.get("_gpudiag_patched"):
        return
    orig = cls.get_request

    def get_request(self):
        t = time.perf_counter()
        got = orig(self)
        try:
            _stamp_listener(getattr(self, "socket", None))
            rec.accept(got[0], arrived_at(got[0], t))
        except Exception:
            pass
        return got

    cls.get_request = get_request
    cls._gpudiag_patched = True


def _stamp_listener(sock: Any) -> None:
    """Stamp a listening socket's arrivals (a no-op in the kernel once on)."""
    if sock is not None:
        try:
            stamp_arrivals(sock)
        except Exception:
            pass


def _patch_http(module: Any, rec: Recorder) -> None:
    patch_handler(module.BaseHTTPRequestHandler, rec)


def _patch_werkzeug(module: Any, rec: Recorder) -> None:
    patch_handler(module.WSGIRequestHandler, rec)


# set while an ASGI request is timed: uvicorn's cycle and the Starlette app it calls are one
# request, timed once (at the outer of the two)
_IN_ASGI: contextvars.ContextVar[bool] = contextvars.ContextVar("gpudiag_asgi", default=False)


class Answer:
    """An ASGI request's answer: `wrap(send)` notes when its last body part was sent (an app
    may run on after it: Starlette's background tasks, Ray Serve's proxy; its client already
    has the answer)."""

    def __init__(self) -> None:
        self.sent: float | None = None

    def wrap(self, send):
        async def sending(message):
            got = await send(message)
            try:
                if message.get("type") == "http.response.body" and not message.get("more_body"):
                    self.sent = time.perf_counter()
            except Exception:
                pass
            return got

        return sending


def _path(scope: Any) -> Any:
    return scope.get("path") if isinstance(scope, dict) else None


async def _timed(
    rec: Recorder, call: Any, conn: Any = None, answer: Answer | None = None, path: Any = None
) -> Any:
    """Await `call()` as one request (the outermost ASGI level only) to its answer sent
    (`answer`, else its return); a connection's first request from when it was made (`conn`:
    its transport)."""
    if _IN_ASGI.get():
        return await call()
    started = None
    try:
        started = rec.start_request(conn)
    except Exception:
        pass
    token = _IN_ASGI.set(True)
    try:
        return await call()
    finally:
        _IN_ASGI.reset(token)
        try:
            if started is not None:
                rec.end_request(*started, answer.sent if answer else None, path)
        except Exception:
            pass


def _patch_uvicorn_cycle(module: Any, rec: Recorder) -> None:
    """uvicorn (h11 or httptools): a request from its cycle's start (headers parsed) to the
    app's return (the answer sent); a connection's first one from the connection made (the
    event loop's accept: parsing the request and starting its task is the server's time too;
    FastAPI's p50 read 12-14% under its client's without it, on a quiet box)."""
    cls = module.RequestResponseCycle
    if cls.__dict__.get("_gpudiag_patched"):
        return
    orig = cls.run_asgi

    async def run_asgi(self, app):
        made = Answer()
        answer: Answer | None = made
        try:
            self.send = made.wrap(self.send)  # the instance's: what run_asgi hands the app
        except Exception:
            answer = None
        conn = getattr(self, "transport", None)
        return await _timed(rec, lambda: orig(self, app), conn, answer, _path(self.scope))

    cls.run_asgi = run_asgi
    cls._gpudiag_patched = True
    for name in ("H11Protocol", "HttpToolsProtocol"):
        proto = getattr(module, name, None)
        if proto is not None and not proto.__dict__.get("_gpudiag_patched"):
            _patch_connection_made(proto, rec)


def _patch_connection_made(proto: Any, rec: Recorder) -> None:
    """Note when each connection of an asyncio protocol class was made (keyed by transport)."""
    orig = proto.connection_made

    def connection_made(self, transport, *args, **kwargs):
        try:
            made = time.perf_counter()
            for listener in getattr(getattr(transport, "_server", None), "sockets", None) or ():
                _stamp_listener(listener)  # asyncio's server: its listening sockets
            sock = transport.get_extra_info("socket")
            rec.accept(transport, made if sock is None else arrived_at(sock, made))
        except Exception:
            pass
        return orig(self, transport, *args, **kwargs)

    proto.connection_made = connection_made
    proto._gpudiag_patched = True


def _patch_starlette(module: Any, rec: Recorder) -> None:
    """Starlette and FastAPI under any ASGI server: an HTTP request is the app's call."""
    cls = module.Starlette
    if cls.__dict__.get("_gpudiag_patched"):
        return
    orig = cls.__call__

    async def __call__(self, scope, receive, send):
        if not isinstance(scope, dict) or scope.get("type") != "http" or _IN_ASGI.get():
            return await orig(self, scope, receive, send)
        answer = Answer()
        return await _timed(
            rec, lambda: orig(self, scope, receive, answer.wrap(send)), None, answer, _path(scope)
        )

    cls.__call__ = __call__
    cls._gpudiag_patched = True


def _patch_aiohttp(module: Any, rec: Recorder) -> None:
    """aiohttp's web server (`web.run_app`, `AppRunner`): a request from its message parsed
    (a connection's first from the connection made, its arrival where stamped) to
    `_handle_request`'s return, its answer written (`finish_response`'s `write_eof`).
    Internals checked: an aiohttp without them is told from its stacks only."""
    cls = getattr(module, "RequestHandler", None)
    if cls is None or cls.__dict__.get("_gpudiag_patched"):
        return
    if not callable(getattr(cls, "_handle_request", None)) or not callable(
        getattr(cls, "connection_made", None)
    ):
        return
    _time_protocol_requests(cls, "_handle_request", rec)


def _time_protocol_requests(cls: Any, name: str, rec: Recorder) -> None:
    """Time an asyncio protocol class's `name(request, ...)` coroutine as one request each (a
    connection's first from the connection made), its `request.path` told from the traffic."""
    orig = getattr(cls, name)

    async def timed(self, request, *args, **kwargs):
        return await _timed(
            rec,
            lambda: orig(self, request, *args, **kwargs),
            getattr(self, "transport", None),
            None,
            getattr(request, "path", None),
        )

    _patch_connection_made(cls, rec)
    setattr(cls, name, timed)
    cls._gpudiag_patched = True


def _patch_tornado_server(module: Any, rec: Recorder) -> None:
    """tornado's HTTPServer: note when each connection's first request reached the kernel
    (its listening sockets stamped at the first connection), keyed by its IOStream."""
    cls = getattr(module, "HTTPServer", None)
    if (
        cls is None
        or cls.__dict__.get("_gpudiag_patched")
        or not callable(getattr(cls, "handle_stream", None))
    ):
        return
    orig = cls.handle_stream

    def handle_stream(self, stream, address, *args, **kwargs):
        try:
            made = time.perf_counter()
            for listener in (getattr(self, "_sockets", None) or {}).values():
                _stamp_listener(listener)
            sock = getattr(stream, "socket", None)
            rec.accept(stream, made if sock is None else arrived_at(sock, made))
        except Exception:
            pass
        return orig(self, stream, address, *args, **kwargs)

    cls.handle_stream = handle_stream
    cls._gpudiag_patched = True


def _patch_tornado_web(module: Any, rec: Recorder) -> None:
    """tornado's RequestHandler: a request from its arrival (a connection's first: the kernel's
    stamp or the connection's accept; a later one: its headers parsed, the request made) to
    `finish()` (the answer handed to the connection), whatever the handler's style (`def`,
    `async def`, an error answered). Internals checked: a tornado without them is told from
    its stacks only."""
    cls = getattr(module, "RequestHandler", None)
    if cls is None or cls.__dict__.get("_gpudiag_patched"):
        return
    if not callable(getattr(cls, "_execute", None)) or not callable(getattr(cls, "finish", None)):
        return
    execute, finish = cls._execute, cls.finish

    def _execute(self, *args, **kwargs):
        try:
            self._gpudiag_started = _tornado_start(rec, self.request)
        except Exception:
            pass
        return execute(self, *args, **kwargs)

    def _finish(self, *args, **kwargs):
        try:
            return finish(self, *args, **kwargs)
        finally:
            try:
                started: tuple[float, float] | None = self.__dict__.pop("_gpudiag_started", None)
                if started is not None:
                    rec.end_request(*started, None, getattr(self.request, "path", None))
            except Exception:
                pass

    cls._execute, cls.finish = _execute, _finish
    cls._gpudiag_patched = True


def _tornado_start(rec: Recorder, request: Any) -> tuple[float, float]:
    """(start, in flight) of a tornado request: its connection's arrival when it is the
    connection's first, else when tornado made the request (its headers parsed)."""
    stream = getattr(getattr(request, "connection", None), "stream", None)
    first = stream is not None and stream in rec.accepted
    t0, in_flight = rec.start_request(stream if first else None)
    made = getattr(request, "_start_time", None)
    if not first and isinstance(made, float):
        t0 -= min(MAX_QUEUED_S, max(0.0, time.time() - made))
    return t0, in_flight


# the poller thread's time of the event it is processing (grpc._server's sync server)
_GRPC_EVENT = threading.local()


def _patch_grpc_server(module: Any, rec: Recorder) -> None:
    """grpcio's sync server (`grpc.server(ThreadPoolExecutor(...))`): an RPC from its arrival
    (the poller thread's `_process_event_and_continue` for the call's event, before the
    server's lock and the handler lookup) to its behavior's return in the thread pool (the
    response and status handed to gRPC core to send); the time queued for a free worker is
    the client's time too. Rejected RPCs (no method, over the concurrency limit) are not
    timed. Internals checked: a grpcio without them is told from its stacks only."""
    if module.__dict__.get("_gpudiag_patched"):
        return
    orig_call, orig_event = module._handle_call, module._process_event_and_continue
    if not callable(orig_call) or not callable(orig_event):
        return

    def _process_event_and_continue(*args, **kwargs):
        _GRPC_EVENT.t = time.perf_counter()
        try:
            return orig_event(*args, **kwargs)
        finally:
            _GRPC_EVENT.t = None

    def _handle_call(*args, **kwargs):
        t = getattr(_GRPC_EVENT, "t", None) or time.perf_counter()
        got = orig_call(*args, **kwargs)
        if is_probe_rpc(_rpc_method(args)):
            return got
        try:
            _time_rpc(rec, got, t)
        except Exception:
            pass
        return got

    module._handle_call = _handle_call
    module._process_event_and_continue = _process_event_and_continue
    module._gpudiag_patched = True


def _rpc_method(args: tuple) -> Any:
    """The method of the call `_handle_call(rpc_event, ...)` was given (None: not known)."""
    try:
        return args[0].call_details.method
    except Exception:
        return None


def _time_rpc(rec: Recorder, got: Any, t0: float) -> None:
    """Time the RPC `_handle_call` handed to the thread pool, `got` its (state, future), from
    `t0` to the future done."""
    fut = got[1] if isinstance(got, tuple) and len(got) == 2 else None
    if fut is None or not hasattr(fut, "add_done_callback"):
        return
    _, in_flight = rec.start_request(None)

    def done(f: Any) -> None:
        try:
            if f.cancelled():  # the server stopped before a worker ran it: no answer
                with rec.lock:
                    rec.in_flight = max(0, rec.in_flight - 1)
            else:
                rec.end_request(t0, in_flight)
        except Exception:
            pass

    fut.add_done_callback(done)


def _patch_grpc_aio(module: Any, rec: Recorder) -> None:
    """grpc.aio's server (its core is compiled: no arrival to hook in Python): an RPC with one
    answer (unary-unary, stream-unary) from its method's lookup (a generic handler's
    `service()`, on the event loop as the call starts; a registered method's: its behavior's
    start) to its behavior's return (the answer then serialized and sent). The handlers are
    wrapped as the server is given them: a server built before the hooks came (attach
    --hooks) is not timed, nor are streamed answers."""
    cls = module.Server
    if cls.__dict__.get("_gpudiag_patched"):
        return
    orig_init = cls.__init__
    orig_add, orig_reg = cls.add_generic_rpc_handlers, cls.add_registered_method_handlers

    class Timed:  # a GenericRpcHandler: grpc only calls its service()
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def service(self, handler_call_details):
            t = time.perf_counter()
            got = self.inner.service(handler_call_details)
            if is_probe_rpc(getattr(handler_call_details, "method", None)):
                return got
            return _aio_timed(got, rec, t)

    def generic(handlers):
        try:
            return tuple(Timed(h) if callable(getattr(h, "service", None)) else h for h in handlers)
        except Exception:
            return handlers

    def __init__(self, thread_pool, generic_handlers, *args, **kwargs):
        orig_init(self, thread_pool, generic(generic_handlers), *args, **kwargs)

    def add_generic_rpc_handlers(self, generic_rpc_handlers):
        return orig_add(self, generic(generic_rpc_handlers))

    def add_registered_method_handlers(self, service_name, method_handlers):
        try:
            if not is_probe_rpc(f"/{service_name}/"):
                method_handlers = {k: _aio_timed(v, rec, None) for k, v in method_handlers.items()}
        except Exception:
            pass
        return orig_reg(self, service_name, method_handlers)

    cls.__init__ = __init__
    cls.add_generic_rpc_handlers = add_generic_rpc_handlers
    cls.add_registered_method_handlers = add_registered_method_handlers
    cls._gpudiag_patched = True


def _aio_timed(handler: Any, rec: Recorder, t0: float | None) -> Any:
    """`handler` (an RpcMethodHandler) with its one-answer behavior timed from `t0` (None:
    from the behavior's start); as it was for a streamed answer or an unknown shape. The
    wrapper keeps the behavior's kind (coroutine function or plain), which grpc.aio reads to
    await it or run it in its thread pool."""
    import inspect

    try:
        if handler is None or handler.response_streaming or not hasattr(handler, "_replace"):
            return handler
        name = "stream_unary" if handler.request_streaming else "unary_unary"
        fn = getattr(handler, name)
        if fn is None or inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            return handler
    except Exception:
        return handler

    def start():
        try:
            t, in_flight = rec.start_request(None)
            return (t if t0 is None else t0, in_flight)
        except Exception:
            return None

    def end(started: Any) -> None:
        try:
            if started is not None:
                rec.end_request(*started)
        except Exception:
            pass

    async def awaited(*args, **kwargs):
        started = start()
        try:
            return await fn(*args, **kwargs)
        finally:
            end(started)

    def called(*args, **kwargs):
        started = start()
        try:
            return fn(*args, **kwargs)
        finally:
            end(started)

    behavior = awaited if inspect.iscoroutinefunction(fn) else called
    return handler._replace(**{name: behavior})


def _timed_call(rec: Recorder, conn: Any, call: Any, path: Any = None) -> Any:
    """`call()` as one request on connection `conn` (started as `Recorder.start_request`
    says: when it was accepted, for its first request), ended once `call` returns or raises;
    a health check or metrics scrape (`path`) not kept."""
    started = None
    try:
        started = rec.start_request(conn)
    except Exception:
        pass
    try:
        return call()
    finally:
        try:
            if started is not None:
                rec.end_request(*started, None, path)
        except Exception:
            pass


def _note_accept_call(cls: Any) -> None:
    """Wrap a gunicorn worker's `accept(listener)` to keep the time of its call on the worker
    (`_gpudiag_t`, for as long as the call runs): the listener's call to accept, before
    `accept()` returns (as socketserver's get_request is timed); the listener asked to stamp
    its connections' arrivals (`arrived_at`)."""
    orig = cls.accept

    def accept(self, listener, *args, **kwargs):
        try:
            self._gpudiag_t = time.perf_counter()
            _stamp_listener(listener)
        except Exception:
            pass
        try:
            return orig(self, listener, *args, **kwargs)
        finally:
            try:
                self._gpudiag_t = None
            except Exception:
                pass

    cls.accept = accept


def _accepted_at(worker: Any, sock: Any) -> float:
    """When the request waiting on `sock` arrived in the kernel (`arrived_at`: a sync
    worker's connections wait in the listen queue while the worker answers another), else
    when the worker's running `accept` was called, else now."""
    t = getattr(worker, "_gpudiag_t", None)
    return arrived_at(sock, time.perf_counter() if not isinstance(t, float) else t)


def _patch_gunicorn_handle(cls: Any, rec: Recorder) -> bool:
    """A gunicorn worker class whose `handle(listener, client, addr)` takes one connection and
    whose `handle_request(listener_name, req, client, addr)` answers each of its requests: the
    connection's arrival noted at `handle` (`_accepted_at`; the listener asked to stamp its
    arrivals), each request timed to `handle_request`'s return. False when it was patched."""
    if cls.__dict__.get("_gpudiag_patched"):
        return False
    orig_handle, orig_request = cls.handle, cls.handle_request

    def handle(self, listener, client, addr, *args, **kwargs):
        try:
            _stamp_listener(listener)
            rec.accept(client, _accepted_at(self, client))
        except Exception:
            pass
        return orig_handle(self, listener, client, addr, *args, **kwargs)

    def handle_request(self, listener_name, req, client, addr, *args, **kwargs):
        return _timed_call(
            rec,
            client,
            lambda: orig_request(self, listener_name, req, client, addr, *args, **kwargs),
            getattr(req, "path", None),
        )

    cls.handle, cls.handle_request = handle, handle_request
    cls._gpudiag_patched = True
    return True


def _patch_gunicorn_sync(module: Any, rec: Recorder) -> None:
    """gunicorn's sync worker (one request a connection, one at a time a process): a request
    from its arrival in the kernel (waiting in the listen queue while the worker answers
    another), else its worker's call to accept the connection, to the answer sent
    (handle_request's return; the connection's graceful close after it waits on the client,
    not the server)."""
    if _patch_gunicorn_handle(module.SyncWorker, rec):
        _note_accept_call(module.SyncWorker)


def _patch_gunicorn_gthread(module: Any, rec: Recorder) -> None:
    """gunicorn's gthread worker: the main thread accepts and hands each connection with a
    request to read to its thread pool (`enqueue_req`), a pool thread reads and answers it. A
    request from its arrival in the kernel where stamped, else (a connection's first) the main
    thread's call to accept it or (a kept-alive one's) the poller seeing it readable, its
    queueing for a pool thread counted, to the answer sent (handle_request's return)."""
    cls = module.ThreadWorker
    if cls.__dict__.get("_gpudiag_patched"):
        return
    orig_enqueue, orig_request = cls.enqueue_req, cls.handle_request

    def enqueue_req(self, conn, *args, **kwargs):
        try:
            rec.accept(conn.sock, _accepted_at(self, conn.sock))
        except Exception:
            pass
        return orig_enqueue(self, conn, *args, **kwargs)

    def handle_request(self, req, conn, *args, **kwargs):
        return _timed_call(
            rec,
            getattr(conn, "sock", None),
            lambda: orig_request(self, req, conn, *args, **kwargs),
            getattr(req, "path", None),
        )

    _note_accept_call(cls)
    cls.enqueue_req, cls.handle_request = enqueue_req, handle_request
    cls._gpudiag_patched = True


def _patch_gunicorn_async(module: Any, rec: Recorder) -> None:
    """gunicorn's async workers (`-k gevent`, `-k eventlet`: AsyncWorker, a greenlet a
    connection): a request from its arrival in the kernel (the listener asked to stamp its
    connections as the first is handled: that one is timed from its handling's start), a
    kept-alive connection's next from its request parsed, to the answer sent
    (handle_request's return). The hooks' thread-locals are greenlet-locals under gevent's
    patching, so each greenlet's request is its own."""
    _patch_gunicorn_handle(module.AsyncWorker, rec)


def _patch_gunicorn_asgi(module: Any, rec: Recorder) -> None:
    """gunicorn's own ASGI worker (`-k asgi`): an HTTP/1 request from its serving's start
    (its headers parsed; a connection's first request from the connection made, its arrival
    where stamped) to its answer complete (`_serve_http_request`'s return: the app may run on
    after it, Starlette's background tasks); the Starlette app it calls is the same request,
    timed once."""
    cls = module.ASGIProtocol
    if cls.__dict__.get("_gpudiag_patched"):
        return
    _time_protocol_requests(cls, "_serve_http_request", rec)


PATCHES = {
    "socketserver": _patch_socketserver,
    "http.server": _patch_http,
    "werkzeug.serving": _patch_werkzeug,
    "uvicorn.protocols.http.h11_impl": _patch_uvicorn_cycle,
    "uvicorn.protocols.http.httptools_impl": _patch_uvicorn_cycle,
    "starlette.applications": _patch_starlette,
    "aiohttp.web_protocol": _patch_aiohttp,
    "tornado.httpserver": _patch_tornado_server,
    "tornado.web": _patch_tornado_web,
    "grpc._server": _patch_grpc_server,
    "grpc.aio._server": _patch_grpc_aio,
    "gunicorn.workers.sync": _patch_gunicorn_sync,
    "gunicorn.workers.gthread": _patch_gunicorn_gthread,
    "gunicorn.workers.base_async": _patch_gunicorn_async,
    "gunicorn.asgi.protocol": _patch_gunicorn_asgi,
}


class _ImportWatcher:
    """A meta path finder that patches a server module right after it is imported; a module
    is crossed off when its import runs, not when a `find_spec` only asks about it."""

    def __init__(self, rec: Recorder | None, patches: dict | None = None) -> None:
        self.rec = rec
        todo = PATCHES if patches is None else patches
        self.pending = {k: v for k, v in todo.items() if k not in sys.modules}
        self._asking = threading.local()  # our own find_spec below: not watched again

    def find_spec(self, name, path=None, target=None):
        patch = self.pending.get(name)
        if patch is None or getattr(self._asking, "on", False):
            return None
        import importlib.util

        self._asking.on = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._asking.on = False
        if spec is not None and spec.loader is not None:
            orig = spec.loader.exec_module

            def exec_module(module):
                orig(module)
                if self.pending.pop(name, None) is not None:
                    _guarded(patch, module, self.rec)
                if not self.pending and self in sys.meta_path:
                    sys.meta_path.remove(self)

            spec.loader.exec_module = exec_module
        return spec


def _guarded(patch: Callable[[Any, Any], None], module: Any, rec: Recorder | None) -> None:
    try:
        patch(module, rec)
    except Exception as exc:  # never break the job
        print(f"gpudiag: request hooks not installed: {exc}", file=sys.stderr)


def when_imported(name: str, patch: Callable[[Any, Any], None]) -> None:
    """Run `patch(module, None)` on module `name` once it is imported (now, if it is)."""
    if name in sys.modules:
        _guarded(patch, sys.modules[name], None)
        return
    sys.meta_path.insert(0, _ImportWatcher(None, {name: patch}))


def install_requests(rec: Recorder) -> None:
    """Patch the server modules already imported; watch for the others."""
    for name, patch in PATCHES.items():
        if name in sys.modules:
            _guarded(patch, sys.modules[name], rec)
    watcher = _ImportWatcher(rec)
    if watcher.pending:
        sys.meta_path.insert(0, watcher)
