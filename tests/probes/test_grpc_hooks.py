"""The serving hooks on grpcio's sync server (`grpc.server(ThreadPoolExecutor(...))`): each RPC
timed once from its arrival (its wait for a free pool thread included) to its answer, with the
RPCs in flight; answers and errors as the server gives them; a grpcio whose internals differ
is left alone (told from its stacks only)."""

from __future__ import annotations

import json
import threading
import time
import types
from concurrent import futures

import pytest

from gpudiag.probes.inject import gpudiag_serve

grpc = pytest.importorskip("grpc")

SERVICE = "test.Model"


def _dumps(obj) -> bytes:
    return json.dumps(obj).encode()


@pytest.fixture
def grpc_rec():
    """The hooks' patch on grpc._server, undone after the test."""
    from grpc import _server

    names = ("_handle_call", "_process_event_and_continue")
    saved = {n: _server.__dict__[n] for n in names}
    r = gpudiag_serve.Recorder(lambda: None)
    gpudiag_serve._patch_grpc_server(_server, r)
    assert _server._handle_call is not saved["_handle_call"]
    yield r
    for n, fn in saved.items():
        setattr(_server, n, fn)
    del _server._gpudiag_patched


def _serve(workers: int, service: str = SERVICE, **methods):
    """A gRPC server on 127.0.0.1 with unary JSON methods: (server, port)."""
    handler = grpc.method_handlers_generic_handler(
        service,
        {
            name: grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=json.loads, response_serializer=_dumps
            )
            for name, fn in methods.items()
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def _stub(channel, method: str, service: str = SERVICE):
    return channel.unary_unary(
        f"/{service}/{method}", request_serializer=_dumps, response_deserializer=json.loads
    )


def _timed(rec, n: int, timeout: float = 10.0) -> list:
    """The request rows once `rec` has `n` (the client has its answer a moment before the
    pool thread's future is done)."""
    deadline = time.monotonic() + timeout
    while len(rec.requests) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # any row beyond n
    return rec.take()[1]


def double(req, context):
    time.sleep(0.05)
    return {"n": req["n"] * 2}


def boom(req, context):
    raise RuntimeError("handler bug")


def test_each_rpc_is_timed_once_with_its_concurrency_and_answers_unchanged(grpc_rec):
    server, port = _serve(8, Double=double, Boom=boom)
    answers: list[int] = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = _stub(channel, "Double")

            def client(i: int) -> None:
                for k in range(5):
                    answers.append(call({"n": i * 10 + k}, timeout=10)["n"])

            threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            with pytest.raises(grpc.RpcError) as err:
                _stub(channel, "Boom")({"n": 1}, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNKNOWN
            with pytest.raises(grpc.RpcError) as missing:
                _stub(channel, "Nope")({"n": 1}, timeout=10)
            assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
            req = _timed(grpc_rec, 21)
    finally:
        server.stop(None).wait()
    assert sorted(answers) == sorted(2 * (i * 10 + k) for i in range(4) for k in range(5))
    # 20 answers and the failed one (answered with its error); the unknown method is not timed
    assert len(req) == 21
    # each of the 20 took its handler's 0.05 s at least; the failed one is quick on a quiet
    # box, but at load 4 a 50 ms wait for the CPU reads as long too
    assert sum(r[1] >= 0.05 for r in req) >= 20
    assert max(r[2] for r in req) >= 2  # parallel clients: several in flight at once
    assert grpc_rec.in_flight == 0


def test_an_rpc_is_timed_from_its_arrival_not_from_a_free_pool_thread(grpc_rec):
    """One pool thread, two RPCs at once: the second waits in the pool's queue for the first
    (the client sees that wait), and its time holds it."""

    def slow(req, context):
        time.sleep(0.2)
        return {"ok": 1}

    server, port = _serve(1, Slow=slow)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            call = _stub(channel, "Slow")
            with futures.ThreadPoolExecutor(2) as pool:
                got = list(pool.map(lambda _: call({}, timeout=10), range(2)))
            req = _timed(grpc_rec, 2)
    finally:
        server.stop(None).wait()
    assert got == [{"ok": 1}, {"ok": 1}]
    took = sorted(r[1] for r in req)
    assert len(took) == 2 and took[0] >= 0.2 and took[1] >= 0.38, took
    assert max(r[2] for r in req) == 2


def test_a_failing_recorder_never_reaches_the_rpc(grpc_rec, monkeypatch):
    def broken(conn):
        raise RuntimeError("recorder bug")

    monkeypatch.setattr(grpc_rec, "start_request", broken)
    server, port = _serve(2, Double=double)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert _stub(channel, "Double")({"n": 4}, timeout=10) == {"n": 8}
    finally:
        server.stop(None).wait()
    assert grpc_rec.requests == []


def test_a_grpcio_without_the_internals_is_left_alone(capsys):
    """Another grpcio's _server module: not patched, nothing raised, the job told so."""
    rec = gpudiag_serve.Recorder(lambda: None)
    other = types.ModuleType("grpc._server")
    other._handle_call = lambda *a: None  # no _process_event_and_continue
    gpudiag_serve._guarded(gpudiag_serve._patch_grpc_server, other, rec)
    assert "_gpudiag_patched" not in other.__dict__
    assert "request hooks not installed" in capsys.readouterr().err


@pytest.fixture
def aio_rec():
    """The hooks' patch on grpc.aio's Server, undone after the test."""
    from grpc.aio import _server as aio_server

    cls = aio_server.Server
    names = ("__init__", "add_generic_rpc_handlers", "add_registered_method_handlers")
    saved = {n: cls.__dict__[n] for n in names}
    r = gpudiag_serve.Recorder(lambda: None)
    gpudiag_serve._patch_grpc_aio(aio_server, r)
    yield r
    for n, fn in saved.items():
        setattr(cls, n, fn)
    del cls._gpudiag_patched


def _aio_serve(
    methods: dict, registered: bool = False, streams: dict | None = None, service: str = SERVICE
):
    """A grpc.aio server on 127.0.0.1 on its own event loop in a thread: (port, stop)."""
    import asyncio

    box: dict = {}
    up = threading.Event()

    async def main() -> None:
        server = grpc.aio.server()
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=json.loads, response_serializer=_dumps
            )
            for name, fn in methods.items()
        }
        for name, fn in (streams or {}).items():
            handlers[name] = grpc.unary_stream_rpc_method_handler(
                fn, request_deserializer=json.loads, response_serializer=_dumps
            )
        if registered:
            server.add_registered_method_handlers(service, handlers)
        else:
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, handlers),)
            )
        box["port"] = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        box["stop"] = asyncio.Event()
        up.set()
        await box["stop"].wait()
        await server.stop(None)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert up.wait(20)

    def stop() -> None:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(20)

    return box["port"], stop


async def adouble(req, context):
    import asyncio

    await asyncio.sleep(0.05)
    return {"n": req["n"] * 2}


async def counting(req, context):
    for i in range(3):
        yield {"i": i}


@pytest.mark.parametrize("registered", [False, True])
def test_grpc_aio_rpcs_with_one_answer_are_timed_with_their_concurrency(aio_rec, registered):
    """grpc.aio: async and plain (run in its thread pool) behaviors, by generic handler or
    registered method, each RPC timed once, answers unchanged; a streamed answer is not
    timed, and still streamed as sent."""
    port, stop = _aio_serve(
        {"Double": adouble, "SyncDouble": double}, registered, streams={"Count": counting}
    )
    answers: list[int] = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:

            def client(i: int) -> None:
                method = "Double" if i % 2 else "SyncDouble"
                for k in range(5):
                    answers.append(_stub(channel, method)({"n": i * 10 + k}, timeout=10)["n"])

            threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            stream = channel.unary_stream(
                f"/{SERVICE}/Count", request_serializer=_dumps, response_deserializer=json.loads
            )
            assert list(stream({}, timeout=10)) == [{"i": 0}, {"i": 1}, {"i": 2}]
            req = _timed(aio_rec, 20)
    finally:
        stop()
    assert sorted(answers) == sorted(2 * (i * 10 + k) for i in range(4) for k in range(5))
    assert len(req) == 20 and all(r[1] >= 0.05 for r in req)
    assert max(r[2] for r in req) >= 2
    assert aio_rec.in_flight == 0


HEALTH = "grpc.health.v1.Health"


def health(req, context):
    return {"status": 1}


def test_a_health_check_rpc_is_not_timed(grpc_rec):
    """gRPC's health service (a load balancer's or Kubernetes' check every few seconds) is not
    the model's traffic: only the model's RPC is a row."""
    server, port = _serve(4, HEALTH, Check=health)
    model, model_port = _serve(4, Double=double)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert _stub(channel, "Check", HEALTH)({}, timeout=10) == {"status": 1}
        with grpc.insecure_channel(f"127.0.0.1:{model_port}") as channel:
            assert _stub(channel, "Double")({"n": 2}, timeout=10) == {"n": 4}
        req = _timed(grpc_rec, 1)
    finally:
        server.stop(None).wait()
        model.stop(None).wait()
    assert len(req) == 1 and req[0][1] >= 0.05
    assert grpc_rec.in_flight == 0


@pytest.mark.parametrize("registered", [False, True])
def test_grpc_aio_control_plane_rpcs_are_not_timed(aio_rec, registered):
    """A server's own control plane (Ray's dashboard agent serves `ray.rpc.*` on grpc.aio) is
    not the model's traffic."""
    port, stop = _aio_serve({"Report": adouble}, registered, service="ray.rpc.ReporterService")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            got = _stub(channel, "Report", "ray.rpc.ReporterService")({"n": 1}, timeout=10)
            assert got == {"n": 2}
        req = _timed(aio_rec, 1, timeout=0.5)
    finally:
        stop()
    assert req == [] and aio_rec.in_flight == 0


@pytest.mark.parametrize(
    "method, probe",
    [
        ("/grpc.health.v1.Health/Check", True),
        (b"/grpc.health.v1.Health/Watch", True),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", True),
        ("/ray.rpc.ReporterService/ReportOCMetrics", True),
        ("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", True),
        ("/test.Model/Double", False),
        ("/inference.GRPCInferenceService/ModelInfer", False),
        (None, False),
    ],
)
def test_probe_rpcs_are_told_from_the_models(method, probe):
    assert gpudiag_serve.is_probe_rpc(method) is probe
