"""The serving hooks inside the job: outermost forwards only, batch size, autograd on, removed
at the first optimizer step; requests timed on a real server; answers never changed."""

from __future__ import annotations

import http.client
import threading
import time
import types
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpudiag.probes.inject import gpudiag_serve
from gpudiag.probes.inprocess.channel import parse_message

torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, fail: bool = False) -> torch.Tensor:
        if fail:
            raise ValueError("planted")
        return self.b(torch.relu(self.a(x)))


@pytest.fixture
def rec():
    r = gpudiag_serve.Recorder(lambda: None)
    gpudiag_serve.install_forwards(torch, r)
    yield r
    while r.handles:
        r.handles.pop().remove()


def test_one_row_per_outermost_forward_with_its_batch_and_grad(rec):
    net = Net()
    net(torch.randn(3, 4))
    with torch.inference_mode():
        net(x=torch.randn(5, 4))  # an input given by keyword
    fwd, _ = rec.take()
    assert [(r[2], r[3]) for r in fwd] == [(3.0, 1.0), (5.0, 0.0)]
    assert all(r[1] > 0 for r in fwd)


class DictNet(torch.nn.Module):
    """A Hugging Face-style model: its input is a dict (a BatchEncoding) of tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, features: dict) -> torch.Tensor:
        return self.emb(features["input_ids"]).mean(dim=1)


def test_parameterless_modules_are_not_model_forwards(rec):
    """torchvision's transforms are nn.Modules with no parameters: a Flask server's
    per-request Normalize was counted as a batch-3 forward with autograd on (INFER001 on a
    server whose model ran under inference_mode)."""
    norm = torch.nn.Identity()  # no parameters, as Resize / CenterCrop / Normalize
    net = Net()
    norm(torch.randn(3, 224, 224))
    with torch.inference_mode():
        net(torch.randn(2, 4))
    fwd, _ = rec.take()
    assert [(r[2], r[3]) for r in fwd] == [(2.0, 0.0)] and rec.local.depth == 0


def test_a_frozen_model_does_not_run_with_autograd_on(rec):
    net = Net().requires_grad_(False)
    net(torch.randn(2, 4))
    fwd, _ = rec.take()
    assert [(r[2], r[3]) for r in fwd] == [(2.0, 0.0)]


def test_the_batch_of_a_dict_input_is_its_tensors_first_dimension(rec):
    DictNet()({"input_ids": torch.zeros(6, 9, dtype=torch.long)})
    fwd, _ = rec.take()
    assert [r[2] for r in fwd] == [6.0]


def test_a_forward_that_raises_leaves_the_count_right(rec):
    net = Net()
    with pytest.raises(ValueError, match="planted"):
        net(torch.randn(2, 4), fail=True)
    net(torch.randn(7, 4))
    fwd, _ = rec.take()
    assert [r[2] for r in fwd][-1] == 7.0 and rec.local.depth == 0


def test_the_hooks_change_no_answer(rec):
    net = Net()
    x = torch.randn(4, 4)
    hooked = net(x)
    while rec.handles:
        rec.handles.pop().remove()
    assert torch.equal(hooked, net(x))


def test_the_first_optimizer_step_removes_the_forward_hooks(rec):
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net(torch.randn(2, 4)).sum().backward()
    opt.step()
    net(torch.randn(2, 4))
    fwd, _ = rec.take()
    assert len(fwd) == 1 and rec.handles == []


class Masked(torch.nn.Module):
    """A model called as Hugging Face's are: `model(input_ids=..., attention_mask=...)`."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, input_ids, attention_mask=None):
        return self.emb(input_ids).sum()


def test_a_training_models_masks_are_sampled_after_the_first_step(rec, monkeypatch):
    """Once the job trains, the global forward hooks are out and no forward row is kept,
    but the model seen forwarding keeps a pre-hook of its own that counts its masks, one
    every TRAIN_MASK_EVERY_S at most."""
    net = Masked()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ids = torch.ones(2, 8, dtype=torch.long)
    mask = torch.tensor([[1] * 3 + [0] * 5, [1] * 5 + [0] * 3])
    net(input_ids=ids, attention_mask=mask).backward()
    opt.step()
    rec.take(), rec.take_extra()  # the forward before the step: recorded as any
    monkeypatch.setattr(gpudiag_serve, "TRAIN_MASK_EVERY_S", 3600.0)
    rec.last_mask = 0.0
    for _ in range(3):  # one counted: the next ones fall inside the interval
        net(input_ids=ids, attention_mask=mask)
    fwd, _ = rec.take()
    pad = rec.take_extra()["pad"]
    assert fwd == [] and rec.forward_handles == () and len(rec.mask_handles) == 1
    assert [row[1:5] for row in pad] == [[2.0, 16.0, 8.0, 10.0]]  # rows, tokens, real, longest
    for h in rec.mask_handles:
        h.remove()


def _ours_in(rec) -> bool:
    """Whether any of the recorder's forward hooks is in torch's global dicts."""
    from torch.nn.modules import module as nn_module

    hooks = set(nn_module._global_forward_hooks) | set(nn_module._global_forward_pre_hooks)
    return any(h.id in hooks for h in rec.handles)


def test_going_quiet_takes_the_forward_hooks_out_and_a_wake_puts_them_back(rec):
    """Quiet hooks (attach --hooks, gpudiag gone) leave no global forward hook: even one that
    returns at once takes every module call off torch's fast path."""
    net = Net()
    net(torch.randn(2, 4))
    gpudiag_serve.go_quiet(rec)
    assert not _ours_in(rec) and rec.forward_handles == ()
    net(torch.randn(3, 4))
    assert rec.take() == ([], [])
    gpudiag_serve.wake(rec)
    assert _ours_in(rec)
    net(torch.randn(4, 4))
    fwd, _ = rec.take()
    assert [r[2] for r in fwd] == [4.0]


def test_a_jobs_own_global_forward_hook_keeps_ours_in_recording_nothing(rec):
    """The dict torch walks when a forward raises is never changed under it: with the job's
    own global hook there, ours stays, returning at once (the slow path is the job's)."""
    from torch.nn.modules import module as nn_module

    seen = []
    job = nn_module.register_module_forward_hook(lambda m, a, out: seen.append(1))
    try:
        gpudiag_serve.go_quiet(rec)
        assert _ours_in(rec)
        Net()(torch.randn(2, 4))
        assert rec.take() == ([], []) and len(seen) == 3  # the job's hook: every module
    finally:
        job.remove()


@pytest.mark.parametrize("own", [False, True], ids=["ours alone", "the job's after ours"])
def test_going_quiet_inside_the_walk_of_a_forward_that_raised_keeps_its_error(own):
    """torch walks the global post-hook dict itself when a forward raised: the hooks going
    quiet from inside that walk (the flush after a forward) must not break it."""
    from torch.nn.modules import module as nn_module

    r = gpudiag_serve.Recorder(lambda: gpudiag_serve.go_quiet(r))
    gpudiag_serve.install_forwards(torch, r)
    job = nn_module.register_module_forward_hook(lambda *a: None, always_call=True) if own else None
    try:
        with pytest.raises(ValueError, match="planted"):
            Net()(torch.randn(2, 4), fail=True)
        assert r.quiet and _ours_in(r) == own
    finally:
        if job is not None:
            job.remove()
        while r.handles:
            r.handles.pop().remove()


def test_the_first_step_with_a_jobs_own_optimizer_pre_hook_after_ours_breaks_nothing(rec):
    """Our step hook leaves torch's pre-hook dict only as its last entry: taken out ahead of
    the job's hook, torch's loop over the dict would raise in the job's optimizer.step()."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    calls = []
    job = register_optimizer_step_pre_hook(lambda *a: calls.append(1))
    try:
        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
        fwd, _ = rec.take()
        assert len(fwd) == 1 and len(calls) == 2 and not _ours_in(rec)
    finally:
        job.remove()


class Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/boom":
            raise RuntimeError("handler bug")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args) -> None:
        pass


def _serving(rec, server_cls, handler_cls):
    """A `server_cls` on 127.0.0.1 serving `handler_cls`, both patched to record into `rec`."""
    gpudiag_serve._patch_socketserver(types.SimpleNamespace(TCPServer=server_cls), rec)
    gpudiag_serve.patch_handler(handler_cls, rec)
    server = server_cls(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_requests_are_timed_from_accept_to_answer_and_answers_unchanged():
    rec = gpudiag_serve.Recorder(lambda: None)

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address) -> None:
            pass  # the planted handler bug, kept off the test's output

    class Handler(Echo):
        pass

    server = _serving(rec, Server, Handler)
    try:
        port = server.server_address[1]
        bodies = []
        for path in ("/a", "/b", "/boom", "/c"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", path)
            try:
                bodies.append(conn.getresponse().read())
            except http.client.RemoteDisconnected:
                bodies.append(None)  # the handler raised: the server dropped the connection
            conn.close()
    finally:
        server.shutdown()
        server.server_close()
    assert bodies == [b"ok", b"ok", None, b"ok"]
    _, req = rec.take()
    assert len(req) == 4 and all(r[1] > 0 and r[2] >= 1 for r in req)
    assert rec.in_flight == 0


def test_a_connection_is_timed_from_its_listeners_call_to_accept_it():
    """The start is taken when the listener, its select done, calls get_request, not when
    accept() returns: that return waits for the GIL again (up to a switch interval on a busy
    server), and the client sees that wait."""

    rec = gpudiag_serve.Recorder(lambda: None)

    class Slow(ThreadingHTTPServer):
        def get_request(self):
            time.sleep(0.05)  # accept() waiting for the GIL back
            return super().get_request()

    class Handler(Echo):
        pass

    server = _serving(rec, Slow, Handler)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("GET", "/a")
        assert conn.getresponse().read() == b"ok"
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
    _, req = rec.take()
    assert len(req) == 1 and req[0][1] >= 0.05


def test_a_request_is_timed_from_its_arrival_in_the_kernel_when_the_listener_is_late():
    """A listener that reaches its select late (its thread waiting for the GIL while the
    handlers run the model) leaves the request queued in the kernel: the client waits from its
    send, and the kernel's receive stamp says when that was, before any call in the server."""

    rec = gpudiag_serve.Recorder(lambda: None)

    class Server(ThreadingHTTPServer):
        pass

    class Handler(Echo):
        pass

    gpudiag_serve._patch_socketserver(types.SimpleNamespace(TCPServer=Server), rec)
    gpudiag_serve.patch_handler(Handler, rec)
    server = Server(("127.0.0.1", 0), Handler)
    gpudiag_serve.stamp_arrivals(server.socket)  # as a first accept leaves it
    answers: list[bytes] = []

    def ask() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("GET", "/a")
        answers.append(conn.getresponse().read())
        conn.close()

    client = threading.Thread(target=ask)
    client.start()
    time.sleep(0.3)  # queued in the kernel: nobody in the server has looked yet
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client.join(10)
    server.shutdown()
    server.server_close()
    _, req = rec.take()
    assert answers == [b"ok"]
    assert len(req) == 1 and 0.3 <= req[0][1] < 5


def test_a_request_ends_at_its_answers_last_write_not_the_handlers_return():
    """The client has its answer when the last bytes are written; the handler's return after
    can wait (for the GIL on a busy server; here, a sleep): the request ends at the write."""

    rec = gpudiag_serve.Recorder(lambda: None)

    class Server(ThreadingHTTPServer):
        pass

    class Lingering(Echo):
        def do_GET(self) -> None:  # noqa: N802
            super().do_GET()
            time.sleep(0.3)

    server = _serving(rec, Server, Lingering)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.request("GET", "/a")
        assert conn.getresponse().read() == b"ok"
        conn.close()
        deadline = time.monotonic() + 10
        while not rec.requests and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        server.shutdown()
        server.server_close()
    _, req = rec.take()
    assert len(req) == 1 and req[0][1] < 0.25
    assert req[0][0] < time.time() - 0.25  # its end (Unix time) is the write's, too


def test_the_arrival_peek_leaves_the_data_and_falls_back_without_a_stamp():
    """`arrived_at` peeks: the bytes are still there to read; a socket with nothing received
    yet, or one that is not a socket, gives the fallback."""
    import socket

    a, b = socket.socketpair()
    try:
        now = time.perf_counter()
        assert gpudiag_serve.arrived_at(b, now) == now  # nothing received yet
        a.sendall(b"hello")
        time.sleep(0.05)
        t = gpudiag_serve.arrived_at(b, time.perf_counter())
        assert b.recv(16) == b"hello"
        assert t <= time.perf_counter()
    finally:
        a.close()
        b.close()
    assert gpudiag_serve.arrived_at(object(), 1.5) == 1.5


@pytest.fixture
def werkzeug_rec():
    """The hooks' patches on Werkzeug's threaded server and request handler, undone after."""
    pytest.importorskip("flask")
    from werkzeug import serving

    r = gpudiag_serve.Recorder(lambda: None)
    gpudiag_serve._patch_socketserver(types.SimpleNamespace(TCPServer=serving.BaseWSGIServer), r)
    gpudiag_serve._patch_werkzeug(serving, r)
    yield r
    for cls in (serving.BaseWSGIServer, serving.WSGIRequestHandler):
        for name in ("get_request", "parse_request", "handle_one_request", "_gpudiag_patched"):
            if name in cls.__dict__:
                delattr(cls, name)


def _twenty_gets(port: int, rec, timed: int = 20) -> list[bytes]:
    """GET /predict/N twenty times from 4 client threads; the answers, once `rec` has timed
    `timed` requests (those and any before them: the client has its answer a moment before
    the server's cycle ends)."""
    answers: list[bytes] = []

    def client(i: int) -> None:
        for k in range(5):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", f"/predict/{i * 10 + k}")
            answers.append(conn.getresponse().read())
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 10
    while len(rec.requests) < timed and time.monotonic() < deadline:
        time.sleep(0.01)
    return answers


def test_a_flask_app_under_werkzeug_is_timed_once_a_request_with_its_concurrency(werkzeug_rec):
    """Flask under Werkzeug's threaded server (what app.run(threaded=True) starts): its
    handler is an http.server handler, each request timed once from its connection
    accepted, the parallel clients seen in flight, answers as sent."""

    from flask import Flask, jsonify
    from werkzeug.serving import make_server

    app = Flask(__name__)

    @app.get("/predict/<int:n>")
    def predict(n: int):
        time.sleep(0.05)
        return jsonify({"n": n * 2})

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        answers = _twenty_gets(server.server_port, werkzeug_rec)
    finally:
        server.shutdown()
        server.server_close()
    _, req = werkzeug_rec.take()
    sent = [2 * (i * 10 + k) for i in range(4) for k in range(5)]
    got = sorted(answers, key=lambda b: int(b.split(b":")[1].strip(b"}\n ")))
    assert [int(b.split(b":")[1].strip(b"}\n ")) for b in got] == sorted(sent)
    assert len(req) == 20 and all(r[1] >= 0.05 for r in req)
    assert max(r[2] for r in req) >= 2  # parallel clients: several in flight at once
    assert werkzeug_rec.in_flight == 0


def test_the_channel_turns_rows_into_samples_and_drops_malformed_ones():
    msg = {
        "fwd": [[1.7e9, 0.01, 4, 1], [1.7e9, "x", 4, 1], [1.7e9, 0.01, 4], [-1, 0.01, 1, 0]],
        "req": [[1.7e9, 0.02, 3], [1.7e9, float("nan"), 1], "junk"],
    }
    got = [(s.labels["kind"], s.values) for s in parse_message(msg)]
    assert got == [
        ("forward", {"forward_time_s": 0.01, "forward_batch": 4.0, "forward_grad": 1.0}),
        ("request", {"request_latency_s": 0.02, "request_in_flight": 3.0}),
    ]


@pytest.fixture
def asgi_rec():
    """The ASGI patches on uvicorn's h11 cycle and on Starlette, undone after the test."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import starlette.applications as sa
    import uvicorn.protocols.http.h11_impl as h11

    saved = [
        (h11.RequestResponseCycle, "run_asgi"),
        (h11.H11Protocol, "connection_made"),
        (sa.Starlette, "__call__"),
    ]
    old = [(cls, name, cls.__dict__[name]) for cls, name in saved]
    r = gpudiag_serve.Recorder(lambda: None)
    gpudiag_serve._patch_uvicorn_cycle(h11, r)
    gpudiag_serve._patch_starlette(sa, r)
    yield r
    for cls, name, fn in old:
        setattr(cls, name, fn)
        del cls._gpudiag_patched


def _fastapi_server(app):
    """A uvicorn server (h11) on 127.0.0.1 in a thread: (server, port)."""
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", http="h11"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    return server, sock.getsockname()[1]


def test_fastapi_under_uvicorn_counts_each_request_once_with_its_concurrency(asgi_rec):
    """A FastAPI app as its docs write one: every request timed once (uvicorn's cycle and
    the app's call are one request), the parallel clients seen in flight, answers as sent."""

    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/predict/{n}")
    def predict(n: int) -> dict:
        time.sleep(0.05)
        return {"n": n * 2}

    server, port = _fastapi_server(app)
    try:
        answers = _twenty_gets(port, asgi_rec)
    finally:
        server.should_exit = True
    _, req = asgi_rec.take()
    sent = [2 * (i * 10 + k) for i in range(4) for k in range(5)]
    assert sorted(answers) == sorted(f'{{"n":{n}}}'.encode() for n in sent)
    assert len(req) == 20
    assert all(r[1] >= 0.05 for r in req)
    assert max(r[2] for r in req) >= 2  # parallel clients: several in flight at once
    assert asgi_rec.in_flight == 0


def test_uvicorn_times_a_connections_first_request_from_the_connection_made(asgi_rec):
    """The event loop's accept, parsing the request and starting its task are the server's
    time too (FastAPI's p50 read 12-14% under its client's from the cycle alone): a client
    that connects, waits 0.2 s, then asks, is timed from its connection."""
    import socket

    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/")
    def root() -> dict:
        return {"ok": 1}

    server, port = _fastapi_server(app)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            time.sleep(0.2)
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = conn.recv(4096)
        deadline = time.monotonic() + 10
        while not asgi_rec.requests and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        server.should_exit = True
    _, req = asgi_rec.take()
    assert answer.startswith(b"HTTP/1.1 200") and len(req) == 1
    assert req[0][1] >= 0.2


def test_uvicorn_times_a_request_from_its_arrival_while_the_event_loop_was_busy(asgi_rec):
    """A request that arrives while the event loop runs something else (an async endpoint's
    model, a long callback) waits in the kernel before the loop accepts it: timed from its
    arrival."""
    import socket

    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/block")
    async def block() -> dict:
        time.sleep(0.3)  # holds the event loop, as a model run inline in `async def` does
        return {"ok": 1}

    @app.get("/")
    async def root() -> dict:
        return {"ok": 1}

    server, port = _fastapi_server(app)
    answers: list[bytes] = []

    def ask(path: str) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            answers.append(conn.recv(4096))

    try:
        ask("/")  # the listener stamps arrivals from its first connection on
        first = threading.Thread(target=ask, args=("/block",))
        first.start()
        time.sleep(0.1)  # the loop is inside /block now
        ask("/")
        first.join(10)
        deadline = time.monotonic() + 10
        while len(asgi_rec.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        server.should_exit = True
    _, req = asgi_rec.take()
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers) and len(req) == 3
    waited = sorted(r[1] for r in req)
    assert waited[1] >= 0.15  # the second "/" waited about 0.2 s for the loop


def test_starlette_called_by_another_asgi_server_times_the_request_once(asgi_rec):
    """Under another ASGI server only the app's call is patched: an HTTP request is one row,
    its answer as sent."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    sent: list[dict] = []

    async def call(scope_type: str) -> None:
        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(msg):
            sent.append(msg)

        scope = {"type": scope_type, "method": "GET", "path": "/", "headers": []}
        scope |= {"query_string": b"", "root_path": ""}
        await app(scope, receive, send)

    asyncio.run(call("http"))
    _, req = asgi_rec.take()
    assert len(req) == 1 and sent[-1]["body"] == b"ok"


@pytest.mark.parametrize(
    "path, probe",
    [
        ("/healthz", True),
        ("/health", True),
        ("/-/healthz", True),
        ("/-/routes", True),
        ("/v2/health/ready", True),
        ("/metrics?x=1", True),
        (b"/readyz/", True),
        ("/predict", False),
        ("/v2/models/m/infer", False),
        ("/healthcheck-model/predict", False),
        (None, False),
    ],
)
def test_health_checks_and_metrics_scrapes_are_told_from_the_traffic(path, probe):
    assert gpudiag_serve.is_probe(path) is probe


def test_a_health_check_is_not_kept_and_leaves_nothing_in_flight():
    rec = gpudiag_serve.Recorder(lambda: None)
    server = _serving(rec, ThreadingHTTPServer, Echo)
    try:
        port = server.server_address[1]
        for path in ("/healthz", "/a", "/-/healthz", "/b"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", path)
            assert conn.getresponse().read() == b"ok"
            conn.close()
    finally:
        server.shutdown()
        server.server_close()
    _, req = rec.take()
    assert len(req) == 2 and rec.in_flight == 0


def test_fastapi_work_after_the_answer_is_not_the_requests_time(asgi_rec):
    """A background task (Starlette's, FastAPI's BackgroundTasks: run after the answer is sent)
    and a health check: the request ends when its answer's last part was sent, the check is
    not kept."""
    from fastapi import FastAPI
    from starlette.background import BackgroundTask
    from starlette.responses import JSONResponse

    app = FastAPI()

    @app.get("/predict/{n}")
    def predict(n: int) -> JSONResponse:
        return JSONResponse({"n": n * 2}, background=BackgroundTask(time.sleep, 0.3))

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": 1}

    server, port = _fastapi_server(app)
    try:
        for path in ("/healthz", "/predict/1", "/healthz", "/predict/2"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", path)
            assert conn.getresponse().status == 200
            conn.close()
        deadline = time.monotonic() + 10
        while len(asgi_rec.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.4)  # the second background task done: no late row
    finally:
        server.should_exit = True
    _, req = asgi_rec.take()
    assert len(req) == 2 and all(r[1] < 0.25 for r in req), req
    assert asgi_rec.in_flight == 0


@pytest.fixture
def aiohttp_rec():
    """The hooks' patch on aiohttp's RequestHandler, undone after the test."""
    web_protocol = pytest.importorskip("aiohttp.web_protocol")
    cls = web_protocol.RequestHandler
    saved = [(name, cls.__dict__[name]) for name in ("_handle_request", "connection_made")]
    r = gpudiag_serve.Recorder(lambda: None)
    gpudiag_serve._patch_aiohttp(web_protocol, r)
    yield r
    for name, fn in saved:
        setattr(cls, name, fn)
    del cls._gpudiag_patched


def _loop_server(start) -> tuple[Callable[[], None], int]:
    """A server on its own event loop in a thread: `start()` (a coroutine function) starts it
    and returns (port, an async cleanup). (stop, port)."""
    import asyncio

    box: dict = {}
    up = threading.Event()

    async def main() -> None:
        box["port"], cleanup = await start()
        box["stop"] = asyncio.Event()
        up.set()
        await box["stop"].wait()
        await cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert up.wait(20)

    def stop() -> None:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(20)

    return stop, box["port"]


def _aiohttp_server(app) -> tuple[Callable[[], None], int]:
    """An aiohttp AppRunner on 127.0.0.1 on its own event loop in a thread: (stop, port)."""
    from aiohttp import web

    async def start():
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner.addresses[0][1], runner.cleanup

    return _loop_server(start)


def test_aiohttp_times_each_request_once_with_its_concurrency(aiohttp_rec):
    """aiohttp's web server as its docs write one: every request one row, from its message
    parsed (a connection's first from the connection made) to its answer written; the
    parallel clients seen in flight; a health check not kept; answers as sent."""
    import asyncio

    from aiohttp import web

    async def predict(request):
        await asyncio.sleep(0.05)
        return web.json_response({"n": int(request.match_info["n"]) * 2})

    async def healthz(request):
        return web.json_response({"ok": 1})

    app = web.Application()
    app.add_routes([web.get("/predict/{n}", predict), web.get("/healthz", healthz)])
    stop, port = _aiohttp_server(app)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b'{"ok": 1}'
        conn.close()
        answers = _twenty_gets(port, aiohttp_rec)
    finally:
        stop()
    _, req = aiohttp_rec.take()
    sent = [2 * (i * 10 + k) for i in range(4) for k in range(5)]
    assert sorted(answers) == sorted(f'{{"n": {n}}}'.encode() for n in sent)
    assert len(req) == 20 and all(r[1] >= 0.05 for r in req)
    assert max(r[2] for r in req) >= 2
    assert aiohttp_rec.in_flight == 0


@pytest.fixture
def tornado_rec():
    """The hooks' patches on tornado's RequestHandler and HTTPServer, undone after the test."""
    web = pytest.importorskip("tornado.web")
    httpserver = pytest.importorskip("tornado.httpserver")
    saved = [
        (web.RequestHandler, "_execute"),
        (web.RequestHandler, "finish"),
        (httpserver.HTTPServer, "handle_stream"),
    ]
    saved = [(cls, name, cls.__dict__[name]) for cls, name in saved]
    r = gpudiag_serve.Recorder(lambda: None)
    gpudiag_serve._patch_tornado_web(web, r)
    gpudiag_serve._patch_tornado_server(httpserver, r)
    yield r
    for cls, name, fn in saved:
        setattr(cls, name, fn)
    del web.RequestHandler._gpudiag_patched, httpserver.HTTPServer._gpudiag_patched


def _tornado_server(handlers: list) -> tuple[Callable[[], None], int]:
    """A tornado Application on 127.0.0.1 on its own event loop in a thread: (stop, port)."""
    import tornado.web

    async def start():
        server = tornado.web.Application(handlers).listen(0, "127.0.0.1")

        async def cleanup() -> None:
            server.stop()

        return next(iter(server._sockets.values())).getsockname()[1], cleanup

    return _loop_server(start)


def test_tornado_times_each_request_once_with_its_concurrency(tornado_rec):
    """tornado's web server as its docs write one (a RequestHandler, `async def get`): every
    request one row, from its arrival to `finish()`; the parallel clients seen in flight; a
    health check, an error answered and a kept-alive connection's later request each ended
    once; answers as sent."""
    import asyncio

    import tornado.web

    class Predict(tornado.web.RequestHandler):
        async def get(self, n):
            await asyncio.sleep(0.05)
            self.write({"n": int(n) * 2})

    class Health(tornado.web.RequestHandler):
        def get(self):
            self.write({"ok": 1})

    class Broken(tornado.web.RequestHandler):
        def get(self):
            raise ValueError("no")

    stop, port = _tornado_server(
        [(r"/predict/(\d+)", Predict), (r"/healthz", Health), (r"/broken", Broken)]
    )
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/healthz")  # a probe, then a kept-alive request on the same
        assert conn.getresponse().read() == b'{"ok": 1}'
        conn.request("GET", "/broken")
        assert conn.getresponse().status == 500
        conn.close()
        answers = _twenty_gets(port, tornado_rec, timed=21)  # and the error before them
    finally:
        stop()
    _, req = tornado_rec.take()
    sent = [2 * (i * 10 + k) for i in range(4) for k in range(5)]
    assert sorted(answers) == sorted(f'{{"n": {n}}}'.encode() for n in sent)
    assert len(req) == 21  # the twenty and the error; the health check not kept
    assert sum(r[1] >= 0.05 for r in req) == 20
    assert max(r[2] for r in req) >= 2
    assert tornado_rec.in_flight == 0


class MaskedNet(torch.nn.Module):
    """A Hugging Face-style encoder called `model(**batch)` or with a features dict."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, input_ids=None, attention_mask=None, features=None) -> torch.Tensor:
        if features is not None:
            input_ids = features["input_ids"]
        return self.emb(input_ids).mean(dim=1)


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return torch.tensor([[1] * n + [0] * (width - n) for n in lengths])


def test_a_forwards_attention_mask_is_counted_padded_real_and_longest(rec):
    net = MaskedNet()
    ids_ = torch.zeros(3, 8, dtype=torch.long)
    with torch.inference_mode():
        net(input_ids=ids_, attention_mask=_mask([2, 5, 3], 8))  # padding="max_length"
        net(features={"input_ids": ids_, "attention_mask": _mask([4, 4, 1], 8).bool()})
        net(ids_, _mask([8, 1, 1], 8))  # by position, as model(ids, mask)
        net(input_ids=ids_)  # no mask: not counted
    pad = rec.take_extra()["pad"]
    assert [r[1:] for r in pad] == [
        [3.0, 24.0, 10.0, 15.0, 192.0, 75.0],
        [3.0, 24.0, 9.0, 12.0, 192.0, 48.0],
        [3.0, 24.0, 10.0, 24.0, 192.0, 192.0],
    ]
    assert len(rec.take()[0]) == 4 and not rec.take_extra()["pad"]


def test_an_additive_or_odd_mask_is_not_counted(rec):
    net = MaskedNet()
    ids_ = torch.zeros(2, 4, dtype=torch.long)
    additive = torch.tensor([[0.0, 0.0, -1e9, -1e9], [0.0, 0.0, 0.0, -1e9]])
    net(input_ids=ids_, attention_mask=additive)
    net(input_ids=ids_, attention_mask=torch.ones(2, 1, 4))  # not 2-D
    assert not rec.take_extra()["pad"]


def test_the_mask_count_changes_no_answer(rec):
    net = MaskedNet()
    ids_, mask = torch.randint(0, 10, (2, 4)), _mask([1, 4], 4)
    before = mask.clone()
    hooked = net(input_ids=ids_, attention_mask=mask)
    while rec.handles:
        rec.handles.pop().remove()
    assert torch.equal(hooked, net(input_ids=ids_, attention_mask=mask))
    assert torch.equal(mask, before)


class FakeEvent:
    done = False

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return FakeEvent.done


def _fake_gpu() -> tuple[types.SimpleNamespace, types.SimpleNamespace]:
    """A torch whose pinned buffers and CUDA events are fakes (FakeEvent.done says when the
    copy is done), and a 2x6 mask "on the GPU" with rows of 3 and 5 real tokens."""
    fake = types.SimpleNamespace(
        empty=lambda n, dtype, pin_memory: torch.empty(n, dtype=dtype),
        cuda=types.SimpleNamespace(Event=FakeEvent),
    )
    mask = types.SimpleNamespace(
        shape=(2, 6), device=types.SimpleNamespace(type="cuda"), sum=_mask([3, 5], 6).sum
    )
    return fake, mask


def test_a_gpu_mask_is_read_only_once_its_copy_is_done_one_forward_in_four():
    """A mask on a GPU: summed there, copied without waiting, read once its event is done;
    one forward in GPU_EVERY, never more than MAX_PENDING waiting."""
    from gpudiag.probes.inject import gpudiag_padding as gp

    fake, mask = _fake_gpu()
    FakeEvent.done = False
    p = gp.Padding()
    for _ in range(gp.GPU_EVERY * (gp.MAX_PENDING + 3)):
        p.count(fake, mask, 1.7e9)
    assert len(p.pending) == gp.MAX_PENDING and p.take()[0] == []  # nothing waited for
    FakeEvent.done = True
    rows, _ = p.take()
    assert len(rows) == gp.MAX_PENDING and rows[0][1:] == [2.0, 12.0, 8.0, 10.0, 72.0, 50.0]
    assert not p.pending


def test_the_kept_lengths_are_summed_as_sorted_batches_every_few_seconds():
    from gpudiag.probes.inject import gpudiag_padding as gp

    assert gp.sorted_batches([5, 1, 4, 2, 3], 2) == (2 * 2 + 4 * 2 + 5, 4 * 2 + 16 * 2 + 25)
    p = gp.Padding()
    for lengths in ([9, 1], [2, 8], [7, 3]):
        p._add(1.7e9, 10, lengths)
    assert p.summary(p.last_summary + 1.0) == []  # not due yet
    (row,) = p.summary(p.last_summary + gp.SUMMARY_EVERY_S)
    # sorted 1 2 3 7 8 9 in batches of 2: 2 2 7 7 9 9
    assert row[1:] == [6.0, 36.0, 2 * 4 + 2 * 49 + 2 * 81, 2.0]
    assert p.summary(p.last_summary + 10.0) == []  # nothing new since


def test_the_channel_turns_padding_rows_into_samples_and_drops_impossible_ones():
    msg = {
        "pad": [
            [1.7e9, 3, 24, 10, 15, 192, 75],
            [1.7e9, 3, 24, 16, 15, 192, 75],  # more real tokens than the longest rows hold
            [1.7e9, 0, 0, 0, 0, 0, 0],
            [1.7e9, 3, 24, 10, 15, 192, 300],  # longest squared over padded squared
        ],
        "pads": [[1.7e9, 4096, 9000, 30000, 32], [1.7e9, 1, 9, 9, 1]],
    }
    got = [(s.labels["kind"], s.values) for s in parse_message(msg)]
    assert got == [
        (
            "padding",
            {
                "pad_rows": 3.0,
                "pad_tokens": 24.0,
                "pad_real_tokens": 10.0,
                "pad_longest_tokens": 15.0,
                "pad_sq_tokens": 192.0,
                "pad_longest_sq_tokens": 75.0,
            },
        ),
        (
            "padding_sorted",
            {
                "pads_rows": 4096.0,
                "pads_tokens": 9000.0,
                "pads_sq_tokens": 30000.0,
                "pads_batch": 32.0,
            },
        ),
    ]


def test_a_top_modules_first_forward_is_a_row_and_its_later_ones_are_not(rec):
    """One model serving: one row in all; a model built per request: one a request."""
    net = Net()
    for _ in range(3):
        net(torch.randn(2, 4))
    for _ in range(2):
        Net()(torch.randn(2, 4))
    torch.nn.Identity()(torch.randn(2, 4))  # no parameters: not a model
    rows = rec.take_extra()["mdl"]
    assert len(rows) == 3 and all(r[1] == 1.0 for r in rows)
    assert all(r[2:] == [0.0, 0.0] for r in rows)  # built in code: where from is not known
    assert rec.take_extra()["mdl"] == []


def test_a_new_models_source_tells_the_same_checkpoint_again_from_another(rec):
    """A Hugging Face model (or one holding one, as sentence-transformers' does) says where it
    was loaded from: the same path again is a repeat, another path is not."""

    class Loaded(Net):
        def __init__(self, path: str) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)
            self.inner.name_or_path = path  # as PreTrainedModel.name_or_path gives it

    for path in ("ckpt-a", "ckpt-a", "ckpt-b"):
        Loaded(path)(torch.randn(2, 4))
    rows = rec.take_extra()["mdl"]
    assert [r[2:] for r in rows] == [[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]


def test_gpu_masks_counted_from_several_threads_keep_one_count_and_one_queue():
    """Request threads forward at once: one forward in GPU_EVERY is counted in all, and every
    copy is read once."""
    from gpudiag.probes.inject import gpudiag_padding as gp

    fake, mask = _fake_gpu()
    FakeEvent.done = True
    p = gp.Padding()

    def forwards() -> None:
        for _ in range(200):
            p.count(fake, mask, 1.7e9)

    threads = [threading.Thread(target=forwards) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows, _ = p.take()
    assert p.seen == 800 and len(rows) == 800 // gp.GPU_EVERY and not p.pending
