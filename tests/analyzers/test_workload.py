"""The workload's kind: training, batch inference or server, from stacks and the hooks."""

from __future__ import annotations

from gpudiag.analyzers import analyze
from gpudiag.analyzers.measures.workload import decide_workload
from tests.analyzers.scenario import Scenario, add_thread_stacks, server_windows
from tests.analyzers.test_findings import HEALTHY, windows

INFERENCE = {"forward": 0.85, "data_wait": 0.1, "other": 0.05}


def test_a_training_loop_is_training_from_its_backward_frames():
    a = analyze(windows(Scenario(), shares=HEALTHY).host(0.3).process(0.95).tl)
    assert a.workload.kind == "training" and a.workload.unit == "step"
    assert a.workload.basis == "backward/optimizer frames"


def test_forwards_without_backward_are_batch_inference():
    a = analyze(windows(Scenario(), shares=INFERENCE).host(0.3).process(0.95).tl)
    assert (a.workload.kind, a.workload.unit) == ("inference", "batch")


def test_request_threads_running_the_model_are_a_server():
    w = decide_workload(server_windows(Scenario()).tl.whole())
    assert (w.kind, w.unit) == ("server", "request")
    assert w.basis == "request-handler frames"
    assert any("21 threads" in e for e in w.evidence)  # the listener and 20 request threads


def test_a_trainer_serving_metrics_over_http_is_still_training():
    sc = windows(Scenario(), shares=HEALTHY)
    server_windows(sc, n=1, handlers=1, forward=0.0)
    assert decide_workload(sc.tl.whole()).kind == "training"


def test_a_batch_job_with_a_metrics_listener_is_inference():
    """The model's forwards run outside any server: an idle metrics endpoint is not the job."""
    sc = windows(Scenario(), shares=INFERENCE)
    add_thread_stacks(
        sc, 300, "metrics", {"serve_forever (/usr/lib/python3.11/socketserver.py:233)": 900}
    )
    assert decide_workload(sc.tl.whole()).kind == "inference"


def test_no_work_seen_is_unknown():
    w = decide_workload(Scenario().tl.whole())
    assert w.kind == "unknown"


def test_entering_inference_mode_in_a_server_is_not_backward():
    """The issue's server showed 1.3% 'backward': its handlers entering inference_mode."""
    from tests.analyzers.scenario import HANDLER, SITE

    sc = server_windows(Scenario())
    enter = f"{HANDLER};inference_mode.__enter__ ({SITE}/torch/autograd/grad_mode.py:270)"
    add_thread_stacks(sc, 999, "Thread-999 (process_request_thread)", {enter: 30})
    a = analyze(sc.tl)
    assert a.workload.kind == "server"
    assert a.breakdown.get("backward") == 0.0
    assert "request handlers (21 threads)" in a.breakdown.thread
