"""The serving hooks on gunicorn's own workers (sync and gthread): each request timed once,
from its connection's accept to its answer, with the requests in flight; answers unchanged;
and the hooks' state in a forked child (gunicorn's workers are its master's forks)."""

from __future__ import annotations

import asyncio
import http.client
import os
import socket
import threading
import time
import types

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.inject import gpudiag_hooks, gpudiag_serve
from gpudiag.probes.inprocess.channel import HookProbe

pytest.importorskip("gunicorn")

from gunicorn.config import Config  # noqa: E402
from gunicorn.glogging import Logger  # noqa: E402
from gunicorn.workers import gthread, sync  # noqa: E402


def slow_app(environ, start_response):
    """A WSGI app that takes 0.1 s and answers its path back."""
    time.sleep(0.1)
    body = environ["PATH_INFO"].encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def _listener() -> socket.socket:
    s = socket.create_server(("127.0.0.1", 0), backlog=16)
    return s


def _worker(cls, listener: socket.socket, **settings):
    cfg = Config()
    for k, v in settings.items():
        cfg.set(k, v)
    cfg.set("accesslog", None)
    w = cls(0, os.getppid(), [listener], None, 30, cfg, Logger(cfg))
    w.wsgi = slow_app
    return w


def _ask(port: int, path: str, out: dict) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    out[path] = conn.getresponse().read()
    conn.close()


def _patched(module_cls_name: str, base, patch, rec):
    """A subclass of gunicorn's worker class, patched (gunicorn's own class left as it is)."""
    sub = type(base.__name__, (base,), {})
    patch(types.SimpleNamespace(**{module_cls_name: sub}), rec)
    return sub


def _sync_worker():
    """(recorder, listening socket, a patched sync worker on it)."""
    rec = gpudiag_serve.Recorder(lambda: None)
    cls = _patched("SyncWorker", sync.SyncWorker, gpudiag_serve._patch_gunicorn_sync, rec)
    listener = _listener()
    return rec, listener, _worker(cls, listener)


def test_a_sync_worker_times_each_request_from_its_accept_and_changes_no_answer():
    rec, listener, worker = _sync_worker()
    port = listener.getsockname()[1]
    answers: dict = {}
    try:
        for path in ("/a", "/b", "/c"):
            client = threading.Thread(target=_ask, args=(port, path, answers))
            client.start()
            worker.accept(listener)  # the worker's loop: accept, then handle it to the end
            client.join(10)
    finally:
        listener.close()
        worker.tmp.close()
    assert answers == {"/a": b"/a", "/b": b"/b", "/c": b"/c"}
    _, req = rec.take()
    assert len(req) == 3 and all(0.1 <= r[1] < 5 and r[2] == 1 for r in req)
    assert rec.in_flight == 0


def test_a_sync_worker_counts_the_wait_for_the_request_after_its_accept():
    """The start is the worker's call to accept: a client slow to send its request line
    after connecting is in the request's time (as socketserver's are)."""
    rec, listener, worker = _sync_worker()
    got: list[bytes] = []

    def late_client() -> None:
        with socket.create_connection(listener.getsockname(), timeout=10) as c:
            time.sleep(0.3)
            c.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := c.recv(4096):  # the body may come in a segment of its own
                data += chunk
            got.append(data)

    client = threading.Thread(target=late_client)
    client.start()
    try:
        worker.accept(listener)
        client.join(10)
    finally:
        listener.close()
        worker.tmp.close()
    assert got and got[0].startswith(b"HTTP/1.1 200") and got[0].endswith(b"/late")
    _, req = rec.take()
    # the client's 0.3 s before its request line and the app's 0.1 s, less the moments between
    # its connect and the worker's call to accept (0.398 s at load 7); without the wait: 0.1 s
    assert len(req) == 1 and 0.35 <= req[0][1] < 5


def test_a_sync_worker_times_a_request_queued_in_the_kernel_from_its_arrival():
    """With two sync workers and four clients, half the requests wait in the listen queue
    while each worker answers another: the client waits from its send, and the kernel's
    receive stamp says when that was (the listener stamps arrivals from its first accept)."""
    rec, listener, worker = _sync_worker()
    port = listener.getsockname()[1]
    answers: dict = {}
    try:
        first = threading.Thread(target=_ask, args=(port, "/first", answers))
        first.start()
        worker.accept(listener)
        first.join(10)
        queued = threading.Thread(target=_ask, args=(port, "/queued", answers))
        queued.start()
        time.sleep(0.3)  # in the kernel's queue: the worker is busy elsewhere
        worker.accept(listener)
        queued.join(10)
    finally:
        listener.close()
        worker.tmp.close()
    assert answers == {"/first": b"/first", "/queued": b"/queued"}
    _, req = rec.take()
    assert len(req) == 2 and 0.4 <= req[1][1] < 5  # 0.3 s queued, then the app's 0.1 s


def test_a_connection_without_a_request_is_not_a_request():
    rec, listener, worker = _sync_worker()
    closer = threading.Thread(
        target=lambda: socket.create_connection(listener.getsockname(), timeout=10).close()
    )
    closer.start()
    try:
        worker.accept(listener)
        closer.join(10)
    finally:
        listener.close()
        worker.tmp.close()
    assert rec.take() == ([], []) and rec.in_flight == 0


def test_a_gthread_worker_times_requests_on_its_pool_with_their_concurrency():
    """Four clients at once on a worker of two threads: four rows, two in flight at a time,
    each at least the app's 0.1 s, and a kept-alive connection's second request timed too."""
    rec = gpudiag_serve.Recorder(lambda: None)
    cls = _patched("ThreadWorker", gthread.ThreadWorker, gpudiag_serve._patch_gunicorn_gthread, rec)
    listener = _listener()
    worker = _worker(cls, listener, threads=2)
    worker.tpool = worker.get_thread_pool()
    worker.method_queue.init()
    port = listener.getsockname()[1]
    answers: dict = {}
    clients = [threading.Thread(target=_ask, args=(port, f"/{i}", answers)) for i in range(4)]
    try:
        for c in clients:
            c.start()
        for _ in clients:
            worker.accept(listener)  # the poller said the listener was readable
        for c in clients:
            c.join(10)
        deadline = time.monotonic() + 10
        while len(rec.requests) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.tpool.shutdown(wait=True)
        worker.method_queue.close()
        listener.close()
        worker.tmp.close()
    assert answers == {f"/{i}": f"/{i}".encode() for i in range(4)}
    _, req = rec.take()
    assert len(req) == 4 and all(0.1 <= r[1] < 5 for r in req)
    assert max(r[2] for r in req) == 2 and rec.in_flight == 0


def test_instrument_sends_to_its_parents_attach_socket_when_it_has_none(tmp_path, monkeypatch):
    """`gpudiag attach MASTER` binds the master's socket; a worker's instrument()-ed hooks,
    finding none at their own pid's path, send there."""
    monkeypatch.setattr(gpudiag_hooks, "RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.setattr(gpudiag_hooks, "attach_path", lambda pid: str(tmp_path / "rt" / f"a-{pid}"))
    probe = HookProbe(gpudiag_hooks.attach_path(os.getppid()), optional=True)
    assert probe.open(Target(os.getppid())).available
    try:
        channel = gpudiag_hooks._Channel(None)
        assert channel.send(
            {"v": 2, "pid": os.getpid(), "width": 9, "req": [[time.time(), 0.1, 1]]}
        )
        assert channel.dropped == 0
        got = [s for s in probe.sample() if s.labels.get("kind") == "request"]
        assert len(got) == 1
    finally:
        probe.close()


async def _asgi_app(scope, receive, send):
    """An ASGI app that takes 0.1 s and answers its path back."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await asyncio.sleep(0.1)
    body = scope["path"].encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def test_gunicorns_asgi_worker_times_a_request_from_its_connection_made():
    """gunicorn's own ASGI worker, its protocol on a real event loop: one row a request, the
    answer unchanged; a connection's first request from the connection made (a client that
    connects, then sends 0.3 s later, is timed about 0.4 s: its request's parsing is the
    server's time too, and the app's own 0.1 s)."""
    protocol = pytest.importorskip("gunicorn.asgi.protocol")
    gasgi = pytest.importorskip("gunicorn.workers.gasgi")
    rec = gpudiag_serve.Recorder(lambda: None)
    cls = _patched("ASGIProtocol", protocol.ASGIProtocol, gpudiag_serve._patch_gunicorn_asgi, rec)
    listener = _listener()
    worker = _worker(gasgi.ASGIWorker, listener)
    worker.asgi = _asgi_app
    worker.loop = loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(lambda: cls(worker), sock=listener))
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    got: list[bytes] = []

    def late_client() -> None:
        with socket.create_connection(listener.getsockname(), timeout=10) as c:
            time.sleep(0.3)
            c.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := c.recv(4096):
                data += chunk
            got.append(data)

    try:
        late_client()
        deadline = time.monotonic() + 10
        while not rec.requests and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
        worker.tmp.close()
    assert got and got[0].startswith(b"HTTP/1.1 200") and got[0].endswith(b"/late")
    _, req = rec.take()
    # made just after the client's connect returned: 0.3 s before its request, less a hair
    assert len(req) == 1 and 0.35 <= req[0][1] < 5 and req[0][2] == 1


def test_an_async_worker_times_each_request_of_a_kept_alive_connection():
    """gunicorn's async workers (gevent, eventlet: `base_async.AsyncWorker`, one greenlet a
    connection) handle a connection's requests in `handle`'s keep-alive loop: each is one
    request, the first from its accept, the answers unchanged. Run here on a plain thread
    (the worker's `timeout_ctx` made a no-op): the patch is gunicorn's, not gevent's."""
    import contextlib

    from gunicorn.workers import base_async

    rec = gpudiag_serve.Recorder(lambda: None)
    base = type("AsyncWorker", (base_async.AsyncWorker,), {"timeout_ctx": contextlib.nullcontext})
    cls = _patched("AsyncWorker", base, gpudiag_serve._patch_gunicorn_async, rec)
    listener = _listener()
    worker = _worker(cls, listener, keepalive=2)
    got: list[bytes] = []

    def client() -> None:
        with socket.create_connection(listener.getsockname(), timeout=10) as c:
            for path, close in (("/one", ""), ("/two", "Connection: close\r\n")):
                c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{close}\r\n".encode())
                data = b""
                while not data.endswith(path.encode()):
                    data += c.recv(4096)
                got.append(data)

    t = threading.Thread(target=client)
    t.start()
    try:
        conn, addr = listener.accept()
        worker.handle(listener, conn, addr)
        t.join(10)
    finally:
        listener.close()
        worker.tmp.close()
    assert [g.rsplit(b"\r\n", 1)[-1] for g in got] == [b"/one", b"/two"]
    _, req = rec.take()
    assert len(req) == 2 and all(0.1 <= r[1] < 5 and r[2] == 1 for r in req)
    assert rec.in_flight == 0
