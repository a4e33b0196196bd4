"""SERVE001 and INFER001 over scripted timelines: a server's stacks and the hooks' forwards
and requests; healthy servers and training jobs get neither."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.findings.serving import batching_values
from gpudiag.analyzers.measures.workload import is_handling
from tests.analyzers.scenario import (
    SITE,
    STD,
    Scenario,
    add_thread_stacks,
    hook_serving,
    server_windows,
)
from tests.analyzers.test_findings import HEALTHY, ids, windows


def server(**kw) -> Scenario:
    return hook_serving(server_windows(Scenario()), **kw)


def test_batch_one_under_concurrency_is_serve001_with_batching_values():
    # 200 requests/s answered in 20 ms: 4 in flight, each a 10 ms forward of batch 1
    a = analyze(server(rate=200.0, latency_s=0.02, forward_s=0.01, grad=0.0).tl)
    assert a.workload.kind == "server"
    assert ids(a) == ["SERVE001"]
    f = a.findings[0]
    ev = {e.metric: e for e in f.evidence}
    assert ev["requests_in_flight_mean"].value == pytest.approx(4.0, rel=0.05)
    assert ev["forward_batch_p50"].setting == "serve_batch_max"
    # half of a request's time is its forward; 4 could share one: 0.5 * (1 - 1/4)
    assert f.impact == pytest.approx(0.375, abs=0.03)
    # a hypothesis: from no gain (a batch costing its requests, as on a CPU) to the bound
    assert f.speedup_kind == "hypothesis" and f.speedup_low == 1.0
    assert f.expected_speedup == pytest.approx(1 / (1 - 0.375), abs=0.08)
    assert f.severity == "warning" and "unverified" in f.speedup_basis
    assert ev["forward_batch_p50"].unit == "items"
    # 5 in flight at the peak -> max batch 8; 7 more requests take 35 ms at 200/s, capped
    # by one forward's 10 ms
    assert "max batch 8, max wait 10.0 ms" in f.recommendation.summary


@pytest.mark.parametrize(
    ("frame", "advice"),
    [
        ("LitServer.run (SITE/litserve/server.py:1519)", "LitServe: LitAPI(max_batch_size=8"),
        (
            "main (SITE/_bentoml_impl/worker/service.py:208)",
            "BentoML: @bentoml.api(batchable=True, max_batch_size=8, max_latency_ms=1000)",
        ),
    ],
)
def test_serve001_names_the_frameworks_own_batcher_first(frame, advice):
    """A server whose stacks pass through LitServe's or BentoML's (1.2+) own code: its
    batcher's settings first, with SERVE001's values; BentoML's max_latency_ms a cap well
    above the p99 (requests past it are refused), not a batching wait."""
    sc = Scenario()
    add_thread_stacks(sc, 7, "MainThread", {frame.replace("SITE", SITE): 50})
    sc = hook_serving(server_windows(sc), rate=200.0, latency_s=0.02, forward_s=0.01, grad=0.0)
    f = next(f for f in analyze(sc.tl).findings if f.id == "SERVE001")
    assert f.recommendation.actions[0].startswith(advice)
    plain = analyze(server(rate=200.0, latency_s=0.02, forward_s=0.01, grad=0.0).tl)
    assert not any(a.startswith(advice[:8]) for a in plain.findings[0].recommendation.actions)


def test_a_batched_server_with_autograd_off_has_no_finding():
    a = analyze(server(rate=200.0, latency_s=0.02, forward_s=0.01, batch=4.0, grad=0.0).tl)
    assert a.workload.kind == "server" and ids(a) == []
    assert a.metrics["forward_batch_p50"] == 4.0
    assert a.metrics["requests_per_second"] == pytest.approx(200.0, rel=0.01)


def test_one_client_at_a_time_is_not_serve001():
    """One request in flight: nothing to batch."""
    a = analyze(server(rate=50.0, latency_s=0.01, forward_s=0.008, grad=0.0).tl)
    assert "SERVE001" not in ids(a)


def test_forwards_with_autograd_on_and_no_backward_are_infer001():
    a = analyze(server(rate=50.0, latency_s=0.01, forward_s=0.008, grad=1.0).tl)
    assert ids(a) == ["INFER001"]
    ev = {e.metric: e for e in a.findings[0].evidence}
    assert ev["forward_grad_share"].value == 1.0
    assert ev["forward_grad_share"].setting == "infer_grad_share"


def test_batch_inference_with_autograd_on_is_infer001():
    sc = windows(Scenario(), shares={"forward": 0.9, "other": 0.1}).host(0.3).process(0.95)
    a = analyze(hook_serving(sc, rate=60.0, forward_s=0.015, batch=16.0, requests=False).tl)
    assert a.workload.kind == "inference"
    assert ids(a) == ["INFER001"]
    assert a.metrics["items_per_second"] == pytest.approx(60.0, rel=0.05)


def test_infer001_is_a_warning_at_most_as_every_hypothesis():
    """What inference mode gives back is a hypothesis until `try` measures it: a warning at
    any impact, as SERVE001 and INFER002 (the H100 Flask server's 43% read as an error)."""
    from gpudiag.analyzers.model.thresholds import Thresholds

    sc = windows(Scenario(), shares={"forward": 0.9, "other": 0.1}).host(0.3).process(0.95)
    a = analyze(hook_serving(sc, rate=60.0, forward_s=0.015, requests=False).tl)
    f = next(f for f in a.findings if f.id == "INFER001")
    assert f.speedup_kind == "hypothesis"
    assert f.impact >= Thresholds().error_impact and f.severity == "warning"


def test_a_training_job_gets_no_serving_metric_or_finding():
    sc = windows(Scenario(), shares=HEALTHY).host(0.3).process(0.95)
    a = analyze(hook_serving(sc, rate=60.0, batch=16.0, requests=False).tl)
    assert a.workload.kind == "training"
    assert ids(a) == [] and "forwards" not in a.metrics


def test_batching_values_follow_the_arrival_rate_and_forward_time():
    m = {"requests_in_flight_max": 3, "requests_per_second": 1000.0, "forward_time_p50_s": 0.05}
    assert batching_values(m) == (4, 3.0)  # 3 more requests arrive in 3 ms
    m = {"requests_in_flight_max": 200, "requests_per_second": 10.0, "forward_time_p50_s": 0.02}
    assert batching_values(m) == (64, 20.0)  # capped: 64 at most, one forward's time


def test_without_the_hooks_forwards_on_the_request_threads_are_serve001_estimated():
    """attach without instrument(): four request threads each running its own forward."""
    a = analyze(server_windows(Scenario(), handlers=4, forward=0.8).tl)
    assert ids(a) == ["SERVE001"]
    f = a.findings[0]
    assert f.signals == ("stacks",) and f.confidence < 0.9  # a request may carry a batch
    ev = {e.metric: e for e in f.evidence}
    assert ev["requests_in_flight_est"].value == pytest.approx(4.0, rel=0.01)
    assert f.impact == pytest.approx(0.8 * 0.75, abs=0.01)
    assert "max wait" not in f.recommendation.summary  # no forward time measured


def test_without_the_hooks_a_batcher_thread_is_not_serve001():
    """The request threads wait for a batcher thread that runs the model: nothing to say."""
    a = analyze(server_windows(Scenario(), handlers=4, forward=0.0).tl)
    assert a.workload.kind == "server" and "SERVE001" not in ids(a)


def _model_thread(server: bool) -> Scenario:
    """A model thread that runs batches of 4 a tenth of its time and waits on its queue for
    requests the rest; under a threaded server whose request threads wait for its answers
    (`server`), or alone (a loop fed by a queue)."""
    from tests.analyzers.scenario import HANDLER, SERVE_MAIN, STD, add_thread_stacks

    model = (
        f"Thread._bootstrap ({STD}/threading.py:1002);Thread.run ({STD}/threading.py:982)"
        ";Batcher._loop (/work/serve.py:72)"
    )
    stacks = {
        f"{model};Queue.get ({STD}/queue.py:180);Condition.wait ({STD}/threading.py:331)": 270,
        f"{model};run (/work/serve.py:50);Module._wrapped_call_impl "
        f"({SITE}/torch/nn/modules/module.py:1511);Net.forward (/work/model.py:20)": 30,
    }
    waiting = (
        f"{HANDLER};Batcher.submit (/work/serve.py:64);Event.wait ({STD}/threading.py:629)"
        f";Condition.wait ({STD}/threading.py:327)"
    )
    sc = Scenario()
    for w in range(5):
        sc.t += 3_000_000_000
        add_thread_stacks(sc, 90, "batcher", stacks)
        if server:
            add_thread_stacks(sc, 100, "MainThread", {SERVE_MAIN: 300})
            for h in range(4):
                add_thread_stacks(sc, 2000 + 4 * w + h, f"Thread-{h}", {waiting: 300})
        sc._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {"ticks": 300, "duration_s": 3.0, "rate_hz": 100.0, "errors": 0},
        )
    return hook_serving(sc, rate=100.0, latency_s=0.03, batch=4.0, grad=0.0, requests=server)


def test_a_servers_model_thread_waiting_for_requests_is_idle_not_loop001():
    """The healthy batching servers (serve_http.py, serve_flask.py --healthy) got LOOP001 as
    an error: their batcher, the loop thread, waits on its queue 90% of the time between
    requests. A server's waits on a queue or event are its idle time; the same thread feeding
    a batch loop (no server) still has its wait named."""
    a = analyze(_model_thread(server=True).tl)
    assert a.workload.kind == "server" and a.profile.thread.thread == "batcher"
    assert ids(a) == []
    alone = analyze(_model_thread(server=False).tl)
    assert alone.workload.kind == "inference"
    f = next(f for f in alone.findings if f.id == "LOOP001")
    assert "queue.Queue.get" in f.message and f.impact == pytest.approx(0.9, abs=0.02)


def test_a_tokenizer_on_the_request_path_is_serve002_named_by_location():
    # per handler: 30% tokenizing, 40% in the model, 15% JSON, 15% sending (I/O)
    sc = hook_serving(
        server_windows(Scenario(), forward=0.4, tokenize=0.3), rate=50.0, latency_s=0.01
    )
    a = analyze(sc.tl)
    f = next(f for f in a.findings if f.id == "SERVE002")
    # busy: tokenize 0.3 + JSON 0.15 (host) against the model's 0.4
    assert f.impact == pytest.approx(0.45 / 0.85, abs=0.01)
    assert str(f.location) == "/work/serve.py:12:tokenize"
    ev = {e.metric: e for e in f.evidence}
    assert ev["request_path_host_share"].setting == "serve_host_warn"


def test_a_server_mostly_in_its_model_is_not_serve002():
    sc = hook_serving(server_windows(Scenario(), forward=0.8), rate=50.0, latency_s=0.01)
    assert "SERVE002" not in ids(analyze(sc.tl))


def test_a_server_module_being_imported_is_not_the_request_path():
    """A FastAPI server's start-up imports uvicorn (server frames under importlib): not a
    request being handled (SERVE002 named the `import uvicorn` line of a FastAPI server)."""
    from tests.analyzers.scenario import SITE, add_thread_stacks

    importing = (
        "<module> (/work/serve_fastapi.py:20);_find_and_load (<frozen importlib._bootstrap>:1360)"
        f";<module> ({SITE}/starlette/routing.py:12);<module> ({SITE}/starlette/requests.py:40)"
    )
    sc = Scenario()
    for _ in range(5):  # the imports in every window, beside the handlers
        server_windows(sc, n=1, forward=0.8)
        add_thread_stacks(sc, 7, "importer", {importing: 300})
    a = analyze(hook_serving(sc, rate=50.0, latency_s=0.01).tl)
    assert a.workload.kind == "server" and "SERVE002" not in ids(a)


def test_serve001_and_infer001_unverified_rank_by_impact_and_the_verdict_is_not_sure():
    """The planted server's two causes, both hypotheses from x1.00 (batching did not help on a
    CPU; inference mode did nothing for a public server's BERT, doubled the planted one's
    rate): ranked by impact, and a verdict whose top finding rests on an unmeasured gain is
    not sure."""
    a = analyze(server(rate=200.0, latency_s=0.02, forward_s=0.015, grad=1.0).tl)
    assert ids(a) == ["SERVE001", "INFER001"]
    assert a.findings[0].impact >= a.findings[1].impact
    assert a.verdict["sure"] is False and "unverified" in a.verdict["statement"]
    infer = a.findings[1]
    assert infer.fix == {"kind": "inference_mode", "values": {}}
    # autograd's per-forward work from nothing to 55% of the forward time
    busy = min(1.0, a.metrics["forward_concurrency"] / a.metrics["requests_in_flight_mean"])
    assert infer.speedup_low == pytest.approx(1.0)
    assert infer.expected_speedup == pytest.approx(1 / (1 - 0.55 * busy), rel=0.01)
    assert "0.75" not in a.verdict["statement"]


def test_infer001_range_is_the_same_at_any_batch():
    """Measured: 11-42% of a forward on a CPU at batch 1 to 32, 50-54% on an H100 at batch 1
    to 64 (a launch-bound forward): no batch rule held, so the range does not move with it."""
    sc = windows(Scenario(), shares={"forward": 0.9, "other": 0.1}).host(0.3).process(0.95)
    small = analyze(hook_serving(sc, rate=60.0, forward_s=0.015, batch=1.0, requests=False).tl)
    sc = windows(Scenario(), shares={"forward": 0.9, "other": 0.1}).host(0.3).process(0.95)
    big = analyze(hook_serving(sc, rate=640.0, forward_s=0.09, batch=64.0, requests=False).tl)
    s, b = small.findings[0], big.findings[0]
    assert s.id == b.id == "INFER001"
    assert s.speedup_low == pytest.approx(b.speedup_low, rel=0.01)
    assert b.expected_speedup == pytest.approx(s.expected_speedup, rel=0.01)


def _on_gpu(sc: Scenario, util: float, mem_gib: float = 9.0) -> Scenario:
    """The scenario's span on a fake-NVML H100 (80 GB) held by the job, `util`% busy."""
    from gpudiag.probes.base import Target
    from gpudiag.probes.gpu.nvml import Nvml
    from gpudiag.probes.gpu.probe import GpuProbe
    from tests.analyzers.test_gpu_findings import ME
    from tests.probes.fake_nvml import FakeGpu, FakeNvml, const
    from tests.probes.test_gpu_probe import Clock

    gpu = FakeGpu(job_pids=[ME], util=const(util), job_mem=const(mem_gib * 2**30))
    clock = Clock()
    probe = GpuProbe(Nvml(FakeNvml([gpu], clock=clock)), clock_ns=clock.ns)
    assert probe.open(Target(ME)).available
    for _ in range(20):
        clock.t += 1.0
        sc.tl.extend(probe.sample())
    return sc


def _server_on_gpu(util: float, rate: float = 4.0) -> Scenario:
    """A server with a trickle of requests (one at a time) on a GPU holding 9 GiB."""
    return _on_gpu(server(rate=rate, latency_s=0.02, forward_s=0.01, grad=0.0), util)


def _loop_on_gpu(
    util: float, mem_gib: float = 4.0, forward_s: float = 0.09, fwd: str = "forward"
) -> Scenario:
    """A batch-inference loop (batch 8, inference mode) on a GPU: `forward_s` of each of its
    10 forwards a second in the model."""
    sc = windows(Scenario(), shares={fwd: 0.9, "other": 0.1}).host(0.3).process(0.95)
    return _on_gpu(
        hook_serving(sc, rate=80.0, forward_s=forward_s, batch=8.0, grad=0.0, requests=False),
        util,
        mem_gib,
    )


def test_a_loop_in_its_forwards_on_an_idle_gpu_is_infer002_with_a_batch_fix():
    a = analyze(_loop_on_gpu(util=20).tl)
    assert a.workload.kind == "inference"
    f = next(f for f in a.findings if f.id == "INFER002")
    assert f.fix == {"kind": "batch", "values": {"factor": 8}}
    share = a.metrics["forward_concurrency"]
    assert share == pytest.approx(0.9, abs=0.02)
    # the low end: the GPU busy 20% of the time, 22% of the forwards' time: a batch of 8
    # costs one launch and 8x that GPU time; the high end: 8x fewer calls, each call's work
    # fixed (no data wait in this loop)
    g = 0.2 / share
    per_item = 8 / ((1 - g) + 8 * g)
    low = 1 / ((1 - share) + share / per_item)
    assert f.speedup_kind == "hypothesis" and f.speedup_low == pytest.approx(low, rel=0.02)
    assert f.expected_speedup == pytest.approx(8.0)
    assert "batch_size=64" in f.recommendation.actions[0]
    assert "GPU001" not in ids(a)  # the idle it explains is not unexplained


def test_infer002_keeps_the_larger_batch_in_memory_and_leaves_busy_gpus_and_waits_alone():
    f = next(
        f for f in analyze(_loop_on_gpu(util=20, mem_gib=20).tl).findings if f.id == "INFER002"
    )
    assert f.fix["values"]["factor"] == 2  # 20 GiB x2 fits 80% of 80 GB; x4 does not
    assert "INFER002" not in ids(analyze(_loop_on_gpu(util=20, mem_gib=50).tl))  # no room
    assert "INFER002" not in ids(analyze(_loop_on_gpu(util=85).tl))  # the GPU is busy
    # forwards a fifth of the loop: the idle is the input side's, not the batch's
    assert "INFER002" not in ids(analyze(_loop_on_gpu(util=20, forward_s=0.02).tl))


def test_a_server_whose_gpu_idles_is_serve003_with_its_daily_cost():
    a = analyze(_server_on_gpu(util=5).tl)
    f = next(f for f in a.findings if f.id == "SERVE003")
    ev = {e.metric: e for e in f.evidence}
    assert ev["gpu_idle_share"].value == pytest.approx(0.95, abs=0.01)
    assert ev["gpu_idle_share"].setting == "serve_gpu_idle_warn"
    daily = 3.90 * 24 * 0.95  # the built-in H100 price row, as COST001 prices it
    assert f.cost["usd_per_day"] == pytest.approx(daily, abs=0.5)
    assert f"${daily:,.0f}" in f.message and "4.0 requests/s" in f.message
    assert f.impact == 0.0 and f.severity == "warning"  # a cost, ranked after lost time
    assert any("smaller GPU" in x for x in f.recommendation.actions)
    assert not {"SERVE001", "INFER001", "SERVE002"} & set(ids(a))  # the model is fine


def test_a_busy_server_gpu_is_not_serve003_and_a_price_override_is_used():
    from gpudiag.analyzers.cost.prices import Price

    assert "SERVE003" not in ids(analyze(_server_on_gpu(util=60).tl))
    a = analyze(_server_on_gpu(util=10).tl, price=Price(2.0, "--price"))
    f = next(f for f in a.findings if f.id == "SERVE003")
    assert f.cost["usd_per_day"] == pytest.approx(2.0 * 24 * 0.9, abs=0.1)


def test_inference_seen_without_the_hooks_is_never_a_sure_no_bottleneck():
    """A batch-embedding job with autograd on, attached without --hooks: no forward's batch
    or grad mode is known (INFER001/INFER002 cannot be judged), so "no bottleneck" is not
    sure and says what would judge it (it was sure 4 of 5 looks)."""
    sc = windows(Scenario(), shares={"forward": 0.9, "other": 0.1}).host(0.3).process(0.95)
    a = analyze(sc.tl)
    assert a.workload.kind == "inference" and a.metrics.get("forwards") is None
    assert [f.id for f in a.findings if f.severity != "note"] == []
    assert a.verdict["sure"] is False and a.verdict["finding"] is None
    assert "attach --hooks" in a.verdict["statement"]


def test_inference_with_the_hooks_and_nothing_wrong_is_sure():
    sc = windows(Scenario(), shares={"forward": 0.9, "other": 0.1}).host(0.3).process(0.95)
    a = analyze(
        hook_serving(sc, rate=60.0, forward_s=0.015, batch=16.0, grad=0.0, requests=False).tl
    )
    assert a.workload.kind == "inference" and ids(a) == []
    assert a.verdict["sure"] is True


GUNICORN = f"{SITE}/gunicorn"
ARBITER_MAIN = (
    f"<module> ({GUNICORN}/__main__.py:10);run ({GUNICORN}/app/wsgiapp.py:66)"
    f";Arbiter.run ({GUNICORN}/arbiter.py:257);Arbiter.wait_for_signals ({GUNICORN}/arbiter.py:425)"
)
GUNICORN_WORKER = (
    f"<module> ({GUNICORN}/__main__.py:10);Arbiter.run ({GUNICORN}/arbiter.py:257)"
    f";Arbiter.spawn_worker ({GUNICORN}/arbiter.py:760)"
    f";SyncWorker.handle_request ({GUNICORN}/workers/sync.py:190)"
    ";predict (/work/serve_flask.py:40)"
)


def test_gunicorns_master_supervising_its_workers_is_not_the_request_path():
    """gunicorn's master (its arbiter waiting for signals) handles no request: SERVE002 named
    it 100% of an idle master's request path, the model being in its forked workers. A
    worker's stack keeps the arbiter's frames under its own, and is a request handled."""
    assert not is_handling(ARBITER_MAIN)
    assert is_handling(GUNICORN_WORKER)
    sc = Scenario()
    for _ in range(5):
        sc.t += 3_000_000_000
        _master_waits(sc)
    a = analyze(hook_serving(sc, rate=50.0, latency_s=0.01).tl)
    assert a.workload.kind == "server" and "SERVE002" not in ids(a)


ARBITER_STOP = (
    f"<module> ({GUNICORN}/__main__.py:10);run ({GUNICORN}/app/wsgiapp.py:66)"
    f";Arbiter.run ({GUNICORN}/arbiter.py:276);Arbiter.halt ({GUNICORN}/arbiter.py:405)"
    f";Arbiter.stop ({GUNICORN}/arbiter.py:487)"
)


def _master_waits(sc: Scenario, ticks: int = 300) -> None:
    """gunicorn's master at one window: its arbiter waiting for a signal on its queue (its
    source line read, or not: a look read some of them without), and stopping its workers."""
    for stack, code, n in (
        (ARBITER_MAIN, "sig = self.SIG_QUEUE.get(block=True, timeout=timeout)", ticks * 0.8),
        (ARBITER_MAIN, "", ticks * 0.15),
        (ARBITER_STOP, "time.sleep(0.1)", ticks * 0.05),
    ):
        labels = {"mode": "all", "kind": "stack", "pid": "100", "tid": "7"}
        labels |= {"thread": "MainThread", "role": "target", "stack": stack, "code": code}
        sc._add("stacks", labels, {"count": n})


def test_gunicorns_master_waiting_for_a_signal_is_its_idle_time_not_unexplained():
    """The master, the target's one thread whose stacks py-spy reads at the loop's rate
    (its workers' are sampled as children), waits for signals on a queue with no Python
    frame: a server's idle time, as its threads' lock waits are, not LOOP001 at 100%."""
    sc = Scenario()
    for _ in range(5):
        sc.t += 3_000_000_000
        _master_waits(sc)
    a = analyze(hook_serving(sc, rate=50.0, latency_s=0.01).tl)
    assert a.workload.kind == "server"
    assert "LOOP001" not in ids(a) and "SERVE002" not in ids(a)


@pytest.mark.parametrize(
    ("tail", "code", "host"),
    [
        (
            f";write ({SITE}/gunicorn/http/wsgi.py:475);write ({SITE}/gunicorn/util.py:348)",
            "sock.sendall(data)",
            False,
        ),
        (
            f";write ({SITE}/gunicorn/http/wsgi.py:475);write ({SITE}/gunicorn/util.py:348)",
            "x = parse(data)",
            False,
        ),
        (";predict (/work/serve.py:30)", "x = parse(data)", True),
    ],
    ids=["its-send", "its-own-work", "the-apps-work"],
)
def test_a_servers_own_send_and_work_are_not_the_apps_host_work(tail, code, host):
    """gunicorn sends an answer from its own Python (`util.write`: `sock.sendall(data)`, the
    innermost frame gunicorn's, sendall a C call): the server's socket I/O, as a send inside
    socket.py is (a gunicorn worker's answers read as 54% host work, SERVE002 sure). Its
    other work (parsing, headers) is the server framework's, not the app's (a gunicorn sync
    or gevent worker's read 30-36% host work, at SERVE002's threshold): only the app's own
    code and what it calls is."""
    from tests.analyzers.scenario import add_thread_stacks

    sending = (
        f"_worker (/usr/lib/python3.11/concurrent/futures/thread.py:81)"
        f";handle_request ({SITE}/gunicorn/workers/gthread.py:777){tail}"
    )
    sc = Scenario()
    for _ in range(5):
        server_windows(sc, n=1, forward=0.8)
        add_thread_stacks(sc, 9, "ThreadPoolExecutor-0_0", {sending: 600}, code)
    a = analyze(hook_serving(sc, rate=50.0, latency_s=0.01).tl)
    assert ("SERVE002" in ids(a)) is host


ASYNCIO = "/usr/lib/python3.11/asyncio"


def _loop_server(model_on_loop: bool):
    """A FastAPI server's stacks: its event loop (idle a fifth of the time) and the model's
    forward on the loop (an `async def` endpoint) or on a thread-pool worker (`def`); the
    analysis."""
    from tests.analyzers.scenario import SITE, add_thread_stacks

    loop = f"run ({ASYNCIO}/base_events.py:640);_run_once ({ASYNCIO}/base_events.py:1922)"
    call = (
        f";run_asgi ({SITE}/uvicorn/protocols/http/h11_impl.py:403)"
        ";predict (/work/app.py:15)"
        f";_call_impl ({SITE}/torch/nn/modules/module.py:1789);forward (/work/app.py:30)"
    )
    idle = f"{loop};select (/usr/lib/python3.11/selectors.py:468)"
    pool = f"_worker (/usr/lib/python3.11/concurrent/futures/thread.py:81){call}"
    sc = Scenario()
    for _ in range(5):
        sc.t += 3_000_000_000
        if model_on_loop:
            on_loop = f"{loop};_run ({ASYNCIO}/events.py:80){call}"
            add_thread_stacks(sc, 1, "MainThread", {on_loop: 240, idle: 60})
        else:
            add_thread_stacks(sc, 1, "MainThread", {idle: 300})
            add_thread_stacks(sc, 2, "AnyIO worker thread", {pool: 240})
        sc._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {"ticks": 300, "duration_s": 3.0, "rate_hz": 100.0, "errors": 0},
        )
    return analyze(hook_serving(sc, rate=30.0, latency_s=0.12).tl)


def test_the_model_on_the_event_loop_is_serve004_named_at_its_call():
    """An `async def` endpoint calling the model (a public FastAPI sentiment server): its
    forwards hold the loop; with `def` they run in the thread pool and the loop is free."""
    a = _loop_server(True)
    f = next(f for f in a.findings if f.id == "SERVE004")
    assert str(f.location) == "/work/app.py:15:predict"
    assert f.speedup_kind == "hypothesis" and f.severity == "warning"
    inflight = a.metrics["requests_in_flight_mean"]
    assert f.expected_speedup == pytest.approx(max(1 / 0.8, 2.0, inflight), rel=0.01)
    assert "SERVE004" not in ids(_loop_server(False))


SYNC_ACCEPT = (
    f"<module> ({GUNICORN}/__main__.py:10);SyncWorker.run ({GUNICORN}/workers/sync.py:125)"
    f";SyncWorker.run_for_one ({GUNICORN}/workers/sync.py:70)"
    f";SyncWorker.accept ({GUNICORN}/workers/sync.py:32)"
)
UVICORN_LOOP = (
    "<module> (/work/serve.py:60);run (/usr/lib/python3.11/asyncio/runners.py:190)"
    ";BaseEventLoop.run_forever (/usr/lib/python3.11/asyncio/base_events.py:607)"
    ";BaseEventLoop._run_once (/usr/lib/python3.11/asyncio/base_events.py:1922)"
    ";Handle._run (/usr/lib/python3.11/asyncio/events.py:80)"
)


@pytest.mark.parametrize(
    ("stack", "handling"),
    [
        (SYNC_ACCEPT, False),  # the sync worker waiting for a connection
        (
            SYNC_ACCEPT
            + f";SyncWorker.handle ({GUNICORN}/workers/sync.py:135)"
            + f";SyncWorker.handle_request ({GUNICORN}/workers/sync.py:190)"
            + ";predict (/work/serve_flask.py:40)",
            True,
        ),
        (UVICORN_LOOP + ";Server.on_tick (/x/uvicorn/server.py:240)", False),
        (
            UVICORN_LOOP
            + ";RequestResponseCycle.run_asgi (/x/uvicorn/protocols/http/h11_impl.py:403)"
            + ";FastAPI.__call__ (/x/fastapi/applications.py:1054)"
            + ";predict (/work/serve.py:30)",
            True,
        ),
        # uvloop: the loop runs in C below asyncio's runner, idle or in its own I/O (BentoML's
        # worker read 1.0 request in flight from it, always)
        (
            "main (/x/_bentoml_impl/worker/service.py:208);Server.run (/x/uvicorn/server.py:67)"
            ";Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)",
            False,
        ),
        (
            "main (/x/_bentoml_impl/worker/service.py:208);Server.run (/x/uvicorn/server.py:67)"
            ";Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)"
            ";Route.handle (/x/starlette/routing.py:288)",
            True,
        ),
    ],
)
def test_a_request_handled_inside_the_listeners_frame_is_handled(stack, handling):
    """gunicorn's sync worker handles the connection it accepted inside `accept`, an asyncio
    server's request runs inside `_run_once`: under `attach` without the hooks they read as
    the listener, so no request was ever in flight and SERVE001 was never estimated."""
    assert is_handling(stack) is handling


@pytest.mark.parametrize("root", ["/usr/lib/python3/site-packages", "/work/raysite", "/app/vendor"])
def test_a_framework_installed_anywhere_is_the_frameworks_work(root):
    """Ray Serve installed with `pip --target` (no site-packages in its path) read as the app's
    own code: SERVE002 named its replica's event loop as the app's host work."""
    from gpudiag.analyzers.measures.rules import parse_stack
    from gpudiag.analyzers.measures.serving import is_framework_work

    ray = f"_run_user_code_event_loop ({root}/ray/serve/_private/replica.py:3746)"
    mine = "tokenize (/srv/app/serve.py:37)"
    assert is_framework_work(parse_stack(f"main (/srv/app/serve.py:9);{ray}"))
    assert not is_framework_work(parse_stack(f"{ray};{mine}"))


def _loop_on_cpu(batch: float, forward_s: float = 0.09, fwd: str = "forward") -> Scenario:
    """A batch-inference loop in inference mode on a CPU: 10 forwards a second of `batch`
    items, `forward_s` each."""
    sc = windows(Scenario(), shares={fwd: 0.9, "other": 0.1}).host(0.3).process(0.95)
    return hook_serving(
        sc, rate=10.0 * batch, forward_s=forward_s, batch=batch, grad=0.0, requests=False
    )


def test_one_item_a_forward_on_a_cpu_is_not_a_sure_no_bottleneck():
    """No GPU, so INFER002 cannot judge the batch; one item a forward, the loop in its
    forwards: "no bottleneck" is not sure, and says how to find out (a GPT-2 generate() one
    prompt at a time went x5 at 8 prompts a call on this CPU)."""
    a = analyze(_loop_on_cpu(batch=1.0).tl)
    assert a.workload.kind == "inference" and a.findings == ()
    assert not a.verdict["sure"]
    assert "whether a larger batch pays (one item a forward" in a.verdict["statement"]
    assert "batch:factor=8" in a.verdict["statement"]
    batched = analyze(_loop_on_cpu(batch=8.0).tl)  # batches of 8: nothing left unjudged
    assert batched.findings == () and batched.verdict["sure"]
    few = analyze(_loop_on_cpu(batch=1.0, forward_s=0.02).tl)  # forwards a fifth of it
    assert few.verdict["sure"]


def test_generate_one_prompt_at_a_time_says_its_forwards_are_decoding_steps():
    a = analyze(_loop_on_cpu(batch=1.0, fwd="generate").tl)
    assert a.workload.kind == "inference" and not a.verdict["sure"]
    assert any("generate(): each forward is one decoding step" in e for e in a.workload.evidence)
    plain = analyze(_loop_on_cpu(batch=1.0).tl)
    assert not any("generate()" in e for e in plain.workload.evidence)


def test_infer002_on_generate_says_to_pass_more_prompts_a_call():
    f = next(f for f in analyze(_loop_on_gpu(util=20, fwd="generate").tl).findings)
    assert f.id == "INFER002" and f.recommendation.actions[0].startswith("generate() 64 prompts")
    assert "padding_side = 'left'" in f.recommendation.actions[0]
    plain = next(f for f in analyze(_loop_on_gpu(util=20).tl).findings if f.id == "INFER002")
    assert plain.recommendation.actions[0].startswith("DataLoader(")


POOL_THREAD = (
    f"Thread._bootstrap ({STD}/threading.py:1002);Thread.run ({STD}/threading.py:982)"
    f";_worker ({STD}/concurrent/futures/thread.py:83)"
)
ANYIO_THREAD = (
    f"Thread._bootstrap ({STD}/threading.py:1002);Thread._bootstrap_inner "
    f"({STD}/threading.py:1045);WorkerThread.run ({SITE}/anyio/_backends/_asyncio.py:976)"
)
MODEL_CALL = (
    f";predict (/work/serve.py:50);Module._wrapped_call_impl ({SITE}/torch/nn/modules/module.py"
    ":1511);Net.forward (/work/model.py:20)"
)
# uvicorn's event loop in C (uvloop) under BentoML's worker, and a request on it
UVLOOP = (
    f"main ({SITE}/_bentoml_impl/worker/service.py:208);Server.run ({SITE}/uvicorn/server.py:67)"
    f";Runner.run ({STD}/asyncio/runners.py:118)"
)
ON_LOOP = (
    f"{UVLOOP};Route.handle ({SITE}/starlette/routing.py:288)"
    f";ServiceAppFactory.api_endpoint ({SITE}/_bentoml_impl/server/app.py:700)"
)


def _pool_server(
    threaded: bool,
    forward: float,
    batcher: bool = False,
    windows: int = 5,
    in_flight: float | None = None,
):
    """A server whose model runs on a thread pool apart from the requests' threads, one call a
    request: a threaded server's 4 request threads waiting on the pool's futures
    (`threaded`), or an event loop (uvloop) whose requests await an anyio worker thread (as
    BentoML's sync API and FastAPI's def endpoints run); the pool's thread in the forward
    `forward` of its samples, waiting for work the rest. `batcher`: BentoML's dispatcher on
    the loop gathers the requests into one call. `in_flight`: the kernel's connections
    (the conns probe) read that many requests received and not answered, twice a second."""
    from tests.analyzers.scenario import HANDLER, SERVE_MAIN, add_thread_stacks

    sc = Scenario()
    ticks = 300
    fwd = round(forward * ticks)
    for w in range(windows):
        sc.t += 3_000_000_000
        if threaded:
            pool, idle = POOL_THREAD, f"{POOL_THREAD[:-3]}:81)"
            add_thread_stacks(sc, 100, "MainThread", {SERVE_MAIN: ticks})
            waiting = (
                f"{HANDLER};predict (/work/serve.py:44);Future.result "
                f"({STD}/concurrent/futures/_base.py:451);Condition.wait ({STD}/threading.py:327)"
            )
            for h in range(4):
                add_thread_stacks(sc, 2000 + 4 * w + h, f"Thread-{h}", {waiting: ticks})
        else:
            pool = ANYIO_THREAD
            idle = (
                f"{ANYIO_THREAD};Queue.get ({STD}/queue.py:171)"
                f";Condition.wait ({STD}/threading.py:327)"
            )
            main = {UVLOOP: ticks - 30, ON_LOOP: 30}
            if batcher:
                main[
                    f"{UVLOOP};CorkDispatcher.controller "
                    f"({SITE}/bentoml/_internal/marshal/dispatcher.py:310)"
                ] = 10
            add_thread_stacks(sc, 100, "MainThread", main)
        add_thread_stacks(sc, 90, "worker", {pool + MODEL_CALL: fwd, idle: ticks - fwd})
        for _ in range(6 if in_flight is not None else 0):
            sc.t += 500_000_000
            busy = float(bool(in_flight))
            sc._add("conns", {}, {"open": 6.0, "in_flight": in_flight, "busy": busy})
        sc.t -= 3_000_000_000 if in_flight is not None else 0
        sc._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {"ticks": ticks, "duration_s": 3.0, "rate_hz": 100.0, "errors": 0},
        )
    return sc


def test_without_the_hooks_a_model_on_a_thread_pool_is_serve001_from_its_threads():
    """Four request threads wait on the pool's futures while its thread runs the forward 80%
    of the time, one call a request: SERVE001 read across the threads (the forwards at once
    over the requests in flight), not sure. Before, the forward off the request threads gave
    no share, and nothing was named."""
    a = analyze(_pool_server(threaded=True, forward=0.8).tl)
    assert a.workload.kind == "server"
    f = next(f for f in a.findings if f.id == "SERVE001")
    assert f.signals == ("stacks",) and f.confidence < 0.75  # under the on-thread reading
    ev = {e.metric: e for e in f.evidence}
    assert ev["requests_in_flight_est"].value == pytest.approx(4.0, rel=0.01)
    assert ev["pool_forward_est"].value == pytest.approx(0.8, rel=0.01)
    # 0.8 forwards at once over 4 in flight: a fifth of a request in its forward, 4 share one
    assert f.impact == pytest.approx(0.2 * 0.75, abs=0.01)
    assert "pool thread" in f.message
    assert a.verdict["sure"] is False


def test_an_event_loop_awaiting_a_pool_thread_leaves_serve001_not_judged():
    """BentoML's sync API under plain attach: the requests await the pool on the event loop
    (on no thread's stack), the pool's one thread in the forward a fifth of the time: too
    few requests in flight on any stack for SERVE001, and the verdict says it was not
    judged, with what was seen; BentoML's batcher on the loop, and an idle pool, say
    nothing of it."""
    a = analyze(_pool_server(threaded=False, forward=0.2).tl)
    assert a.workload.kind == "server" and "SERVE001" not in ids(a)
    assert a.metrics["pool_forward_est"] == pytest.approx(0.2, rel=0.01)
    assert a.metrics["pool_threads"] == 1.0
    assert a.verdict["sure"] is False
    assert "nor batching (SERVE001)" in a.verdict["statement"]
    assert "0.20 forwards at once" in a.verdict["statement"]
    batched = analyze(_pool_server(threaded=False, forward=0.2, batcher=True).tl)
    assert "pool_forward_est" not in batched.metrics
    assert "SERVE001" not in batched.verdict["statement"]
    idle = analyze(_pool_server(threaded=False, forward=0.0).tl)
    assert [f.id for f in idle.findings if f.severity != "note"] == []
    assert "SERVE001" not in idle.verdict["statement"]


def test_a_batcher_with_a_pool_is_not_serve001_from_the_stacks():
    """A pool call that runs what a batcher gathered (BentoML's dispatcher seen on any
    thread) carries several requests: the threaded pool server with that batcher's frames
    gets no SERVE001 from the stacks."""
    from tests.analyzers.scenario import add_thread_stacks

    sc = _pool_server(threaded=True, forward=0.8)
    disp = f"controller ({SITE}/bentoml/_internal/marshal/dispatcher.py:310)"
    add_thread_stacks(sc, 7, "dispatcher", {disp: 30})
    a = analyze(sc.tl)
    assert "SERVE001" not in ids(a) and "pool_forward_est" not in a.metrics


def test_the_kernels_connections_count_the_requests_an_event_loop_holds():
    """BentoML's sync API under plain attach, with the conns probe: six requests received
    and not answered at every reading, the pool's one thread in the forward a fifth of the
    time: SERVE001 named, not sure, its share from the forwards at once over the kernel's
    requests in flight, BentoML's own batching first with the peak's max batch. One request
    at a time read so is judged: no SERVE001, and nothing left unjudged."""
    a = analyze(_pool_server(threaded=False, forward=0.2, in_flight=6.0).tl)
    f = next(f for f in a.findings if f.id == "SERVE001")
    assert f.confidence == pytest.approx(0.6) and a.verdict["sure"] is False
    ev = {e.metric: e for e in f.evidence}
    assert ev["requests_in_flight_conn"].value == pytest.approx(6.0)
    assert ev["requests_in_flight_conn"].setting == "serve_in_flight_min"
    assert ev["connections_in_flight"].source == "conns"
    # 0.2 forwards at once over 6 in flight, 6 sharing one forward
    assert f.impact == pytest.approx(0.2 / 6 * (1 - 1 / 6), rel=0.02)
    assert "kernel's connections" in f.message
    assert "max batch 8" in f.recommendation.summary
    assert f.recommendation.actions[0].startswith("BentoML: @bentoml.api(batchable=True")
    one = analyze(_pool_server(threaded=False, forward=0.2, in_flight=1.0).tl)
    assert "SERVE001" not in ids(one)
    assert "SERVE001" not in one.verdict["statement"]
    assert one.metrics["connections_in_flight"] == pytest.approx(1.0)


def test_an_idle_uvloop_server_waits_in_its_runner_and_gets_no_warning():
    """An idle BentoML worker: its main thread's innermost frame is asyncio's runner (uvloop's
    loop in C, in its epoll wait), its pool's thread waits for work. Neither a request in
    flight nor the loop's work: it read LOOP001, an error, 100% 'library code:
    _run_module_as_main' once the runner stopped counting as a request handled."""
    from tests.analyzers.scenario import add_thread_stacks

    sc = Scenario()
    idle = f"{ANYIO_THREAD};Queue.get ({STD}/queue.py:171);Condition.wait ({STD}/threading.py:327)"
    for _ in range(5):
        sc.t += 3_000_000_000
        add_thread_stacks(
            sc, 100, "MainThread", {UVLOOP: 300}, "return self._loop.run_until_complete(task)"
        )
        add_thread_stacks(sc, 90, "AnyIO worker thread", {idle: 300})
        sc._add(
            "stacks",
            {"mode": "all", "kind": "window"},
            {"ticks": 300, "duration_s": 3.0, "rate_hz": 100.0, "errors": 0},
        )
    a = analyze(sc.tl)
    assert [f.id for f in a.findings if f.severity != "note"] == []
    assert a.metrics.get("requests_in_flight_est") is None
