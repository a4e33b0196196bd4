"""A gRPC sync server told from its stacks (frames as py-spy showed serve_grpc.py's): the
thread pool's workers handling RPCs are its request handlers; the main thread waiting in
wait_for_termination and the poller thread are not; gRPC's own receive and send on a worker
are the server's I/O, not host work on the request path."""

from __future__ import annotations

from gpudiag.analyzers import analyze
from gpudiag.analyzers.measures.serving import handler_metrics
from tests.analyzers.scenario import SITE, STD, Scenario, add_thread_stacks, hook_serving
from tests.analyzers.test_findings import ids

GRPC = f"{SITE}/grpc"
MAIN = (
    "<module> (/work/serve_grpc.py:92);main (/work/serve_grpc.py:82)"
    f";_Server.wait_for_termination ({GRPC}/_server.py:1483);wait ({GRPC}/_common.py:156)"
    f";_wait_once ({GRPC}/_common.py:112);Event.wait ({STD}/threading.py:629)"
    f";Condition.wait ({STD}/threading.py:331)"
)
POLLER = f"Thread.run ({STD}/threading.py:982);_serve ({GRPC}/_server.py:1314)"
WORKER = (
    f"Thread.run ({STD}/threading.py:982);_worker ({STD}/concurrent/futures/thread.py:83)"
    f";_WorkItem.run ({STD}/concurrent/futures/thread.py:58)"
    f";_unary_response_in_pool ({GRPC}/_server.py:790)"
)
RPC = {
    # the model's forward in the method's behavior
    "forward": f"{WORKER};_call_behavior ({GRPC}/_server.py:610)"
    ";main.<locals>.predict (/work/serve_grpc.py:60)"
    f";Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
    ";Net.forward (/work/model.py:20)",
    # the answer and its status handed to gRPC core (start_server_batch, native)
    "send": f"{WORKER};_status ({GRPC}/_server.py:765)",
    # the request's message received
    "receive": f"{WORKER};_unary_request.<locals>.unary_request ({GRPC}/_server.py:572)",
}
IDLE = f"Thread.run ({STD}/threading.py:982);_worker ({STD}/concurrent/futures/thread.py:81)"


def grpc_windows(sc: Scenario, n: int = 5, workers: int = 4, ticks: int = 300) -> Scenario:
    """n 3 s windows of a gRPC server: the main thread in wait_for_termination, the poller,
    and `workers` pool threads (the same ones every window) each 60% in the model, 25%
    sending answers, 5% receiving requests and 10% idle."""
    for _ in range(n):
        sc.t += 3_000_000_000
        add_thread_stacks(sc, 100, "MainThread", {MAIN: ticks})
        add_thread_stacks(sc, 101, "Thread-1 (_serve)", {POLLER: ticks})
        shares = {RPC["forward"]: 0.6, RPC["send"]: 0.25, RPC["receive"]: 0.05, IDLE: 0.1}
        for w in range(workers):
            name = f"ThreadPoolExecutor-0_{w}"
            add_thread_stacks(sc, 200 + w, name, {k: round(v * ticks) for k, v in shares.items()})
        sc._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {"ticks": ticks, "duration_s": 3.0, "rate_hz": 100.0, "errors": 0},
        )
    return sc


def test_the_pool_threads_are_the_request_handlers_not_the_main_thread():
    a = analyze(grpc_windows(Scenario()).tl)
    assert (a.workload.kind, a.workload.unit) == ("server", "request")
    assert a.workload.basis == "request-handler frames"
    assert "request handlers (4 threads)" in a.breakdown.thread
    # 4 workers 90% busy: 3.6 RPCs in flight a tick (the main thread's wait is not one)
    est = handler_metrics(grpc_windows(Scenario()).tl.whole())["requests_in_flight_est"]
    assert abs(est - 3.6) < 0.01


def test_grpcs_own_receive_and_send_are_not_host_work_on_the_request_path():
    """30% of each worker in gRPC's own code, 60% in the model: not SERVE002."""
    sc = hook_serving(grpc_windows(Scenario()), rate=200.0, latency_s=0.01)
    a = analyze(sc.tl)
    assert a.workload.kind == "server"
    assert "SERVE002" not in ids(a)


def test_a_batched_grpc_server_without_the_hooks_is_a_server():
    """The model on a batcher thread (outside the server's frames), the pool threads waiting
    on it: each pool thread's handling samples count, whatever its stacks' order (the census
    judged every row of a thread by its last stack: an idle pool thread's, no gRPC frame in
    it, made the server a batch-inference job)."""
    batcher = (
        f"Thread.run ({STD}/threading.py:982);Batcher._loop (/work/serve_http.py:80)"
        f";Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
        ";Net.forward (/work/model.py:20)"
    )
    waiting = (
        f"{WORKER};_call_behavior ({GRPC}/_server.py:610)"
        ";main.<locals>.predict (/work/serve_grpc.py:60);Batcher.submit (/work/serve_http.py:66)"
        f";Event.wait ({STD}/threading.py:629);Condition.wait ({STD}/threading.py:327)"
    )
    sc = Scenario()
    for _ in range(5):
        sc.t += 3_000_000_000
        add_thread_stacks(sc, 100, "MainThread", {MAIN: 300})
        add_thread_stacks(sc, 101, "Thread-1 (_serve)", {POLLER: 300})
        add_thread_stacks(sc, 102, "batcher", {batcher: 300})
        for w in range(4):
            stacks = {waiting: 180, RPC["send"]: 60, IDLE: 60}  # the idle stack last
            add_thread_stacks(sc, 200 + w, f"ThreadPoolExecutor-0_{w}", stacks)
        sc._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {"ticks": 300, "duration_s": 3.0, "rate_hz": 100.0, "errors": 0},
        )
    a = analyze(sc.tl)
    assert (a.workload.kind, a.workload.basis) == ("server", "request-handler frames")
