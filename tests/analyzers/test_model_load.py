"""SERVE005 over scripted timelines: request handlers loading a model (from_pretrained on the
request path), told per request by the hooks' first forwards of new top modules; a model
loaded lazily once, or none loaded, gets no SERVE005; the loading is not SERVE002's host work."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.measures.rules import is_model_loading, parse_stack
from tests.analyzers.scenario import (
    HANDLER_STACKS,
    Scenario,
    hook_new_models,
    hook_serving,
    server_windows,
)
from tests.analyzers.test_findings import ids


def loading_server(load: float, new_models: int) -> Scenario:
    """50 requests/s over 15 s (750 forwards), handlers 30% in the model, `load` loading it."""
    sc = server_windows(Scenario(), forward=0.3, load=load)
    sc = hook_serving(sc, rate=50.0, latency_s=0.05, forward_s=0.015, grad=0.0)
    return hook_new_models(sc, new_models)


def test_a_model_built_per_request_is_serve005_at_the_line_that_loads_it():
    a = analyze(loading_server(load=0.5, new_models=750).tl)
    assert ids(a)[0] == "SERVE005" and "SERVE002" not in ids(a)
    f = a.findings[0]
    assert str(f.location) == "/work/serve.py:45:predict"
    ev = {e.metric: e for e in f.evidence}
    assert ev["request_path_load_share"].setting == "serve_load_warn"
    assert ev["models_new_share"].value == pytest.approx(1.0)
    # busy: loading 0.5, the model 0.3, JSON 0.1 (sending is I/O): 0.5 / 0.9
    assert f.impact == pytest.approx(0.5 / 0.9, abs=0.01)
    assert f.confidence >= 0.95 and "Load the model once" in f.recommendation.summary


def test_a_server_loading_a_different_model_each_request_is_not_serve005():
    """Each request names its own checkpoint (the hooks saw 750 sources for 750 models): the
    loading is the requests' work, not a model to load once."""
    sc = server_windows(Scenario(), forward=0.3, load=0.5)
    sc = hook_serving(sc, rate=50.0, latency_s=0.05, forward_s=0.015, grad=0.0)
    assert "SERVE005" not in ids(analyze(hook_new_models(sc, 750, sources=750).tl))
    assert "SERVE005" in ids(analyze(hook_new_models(loading_server(0.5, 0), 750, sources=1).tl))


def test_a_model_loaded_lazily_by_the_first_request_is_not_serve005():
    """The hooks saw one top module for 750 forwards: one load, not one a request."""
    a = analyze(loading_server(load=0.2, new_models=1).tl)
    assert "SERVE005" not in ids(a)


def test_without_the_hooks_a_load_on_the_request_path_is_named_but_not_sure():
    sc = server_windows(Scenario(), forward=0.3, load=0.5)
    a = analyze(sc.tl)
    f = next(f for f in a.findings if f.id == "SERVE005")
    assert f.confidence < 0.7 and "not told" in f.message
    assert a.verdict["statement"].endswith("(gpudiag run, or attach --hooks)")


def test_module_construction_inside_a_load_is_not_a_forward():
    frames = parse_stack(HANDLER_STACKS["load"])
    assert is_model_loading(frames)
    assert not is_model_loading(parse_stack(HANDLER_STACKS["forward"]))
    torch_load = (
        "main (/work/s.py:3);load (/usr/lib/python3.11/site-packages/torch/serialization.py:1000)"
    )
    assert is_model_loading(parse_stack(torch_load))
