"""INFER004 over scripted timelines: a batch-inference loop that loads its model again for
every batch (the loading in every stack window of the loop, or the hooks' forwards run by
models never seen before); a model loaded once at start-up is start-up, not the loop's; the
loading is never a forward; a loop reading data with torch.load is no model load."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from tests.analyzers.scenario import Scenario, hook_new_models, hook_serving
from tests.analyzers.test_findings import ids, windows

RELOADING = {"forward": 0.6, "load": 0.3, "other": 0.1}


def _inference(
    sc: Scenario,
    models: int | None = None,
    sources: int | None = None,
    start_s: float = 0.0,
    seconds: float = 15.0,
) -> Scenario:
    """The hooks' forwards of a batch loop (batch 32, no autograd) for `seconds` from
    `start_s`, and `models` first forwards of new top modules, loaded from `sources` places."""
    sc = hook_serving(sc, seconds, 64.0, 0.2, batch=32.0, grad=0.0, requests=False, start_s=start_s)
    return sc if models is None else hook_new_models(sc, models, sources=sources)


def test_a_model_loaded_for_every_batch_is_infer004_at_its_line_and_in_the_loops_time():
    sc = windows(Scenario(), shares=RELOADING).host(0.3).process(0.95)
    a = analyze(sc.tl)
    assert a.workload.kind == "inference" and ids(a)[0] == "INFER004"
    f = a.findings[0]
    assert str(f.location) == "/work/train.py:12:embed"
    # the stacks alone: the same model again, or a sweep over checkpoints, is not told
    assert f.impact == pytest.approx(0.3, abs=0.01) and 0.55 <= f.confidence <= 0.6
    assert a.verdict["statement"].endswith("(gpudiag run, or attach --hooks)")
    assert "Load the model once" in f.recommendation.summary
    # the loading is the loop's time, not a forward's, and no LOOP001 names it again
    assert a.breakdown.get("forward") == pytest.approx(0.6, abs=0.01)
    assert a.breakdown.get("other") == pytest.approx(0.4, abs=0.01)
    assert "LOOP001" not in ids(a)


def test_the_hooks_tell_a_model_built_per_batch():
    sc = windows(Scenario(), shares=RELOADING).host(0.3).process(0.95)
    a = analyze(_inference(sc, models=30, sources=1).tl)
    f = next(f for f in a.findings if f.id == "INFER004")
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["models_new_share"] == pytest.approx(1.0) and ev["loop_load_share"] >= 0.29
    assert a.verdict["finding"] == "INFER004" and a.verdict["sure"] is True


def test_the_same_checkpoint_loaded_again_is_infer004_a_sweep_over_checkpoints_is_not():
    """The hooks know where each new model came from: the same path again and again is a
    load to keep; a different checkpoint each time (an evaluation sweep) is the job's work,
    and "load it once" would be wrong. Its loading stays the loop's time ("other")."""
    same = windows(Scenario(), shares=RELOADING).host(0.3).process(0.95)
    assert "INFER004" in ids(analyze(_inference(same, models=30, sources=1).tl))
    sweep = windows(Scenario(), shares=RELOADING).host(0.3).process(0.95)
    a = analyze(_inference(sweep, models=30, sources=30).tl)
    assert "INFER004" not in ids(a) and a.metrics["models_repeat_share"] == 0.0
    assert a.breakdown.get("other") == pytest.approx(0.4, abs=0.01)


def test_a_model_loaded_once_at_start_up_is_start_up_not_the_loops_time():
    sc = Scenario()
    sc.window(shares={"load": 0.9, "other": 0.1})  # start-up: loading the model
    windows(sc, shares={"forward": 0.95, "other": 0.05}).host(0.3).process(0.95)
    a = analyze(_inference(sc, models=1).tl)
    assert "INFER004" not in ids(a) and "LOOP001" not in ids(a)
    assert a.breakdown.get("forward") >= 0.9  # the load is neither the loop's nor a forward
    assert a.verdict["sure"] is True


def test_a_lazy_first_load_inside_the_loop_window_is_not_infer004():
    """The first batch loads the model (one window of six); the hooks saw one model."""
    sc = Scenario()
    sc.window(shares={"forward": 0.3, "load": 0.6, "other": 0.1})
    windows(sc, shares={"forward": 0.95, "other": 0.05}).host(0.3).process(0.95)
    a = analyze(_inference(sc, models=1).tl)
    assert "INFER004" not in ids(a)


def test_torch_load_reading_data_in_the_loop_is_no_model_load():
    sc = windows(Scenario(), shares={"forward": 0.6, "torch_load": 0.3, "other": 0.1})
    a = analyze(sc.host(0.3).process(0.95).tl)
    assert "INFER004" not in ids(a)
    assert a.breakdown.get("other") == pytest.approx(0.4, abs=0.01)


def test_a_training_loop_putting_weights_in_every_step_has_them_outside_its_forward():
    """A DQN's target network updated with load_state_dict every step (PyTorch's tutorial):
    loading under torch/nn/modules/module.py, not a forward; a training job has no INFER004."""
    shares = {"forward": 0.3, "backward": 0.35, "optimizer": 0.1, "load_state_dict": 0.25}
    a = analyze(windows(Scenario(), shares=shares).host(0.3).process(0.95).tl)
    assert a.workload.kind == "training" and "INFER004" not in ids(a)
    assert a.breakdown.get("forward") == pytest.approx(0.3, abs=0.01)
    assert a.breakdown.get("other") == pytest.approx(0.25, abs=0.01)


STATE_DICT = {
    "forward": 0.45,
    "build_model": 0.3,
    "read_weights": 0.12,
    "put_weights": 0.08,
    "other": 0.05,
}


def test_a_model_built_and_given_its_weights_per_batch_counts_all_its_loading():
    """`model = Net(); model.load_state_dict(torch.load(f))` in a function called per batch:
    only load_state_dict is a loading call, but building the model and reading its weights
    file in the same function are the same load: all of it is INFER004's share (the fix
    measured x2.1 where load_state_dict alone was 15%), and LOOP001 does not name it again."""
    a = analyze(windows(Scenario(), shares=STATE_DICT).host(0.3).process(0.95).tl)
    f = next(f for f in a.findings if f.id == "INFER004")
    assert f.impact == pytest.approx(0.5, abs=0.01)
    assert f.location is not None and f.location.function == "load_model"
    assert a.breakdown.get("other") == pytest.approx(0.55, abs=0.01)
    assert "LOOP001" not in ids(a)


def test_a_whole_model_torch_loaded_per_batch_is_infer004_once_the_hooks_see_it_new():
    """`model = torch.load(f, weights_only=False)` per batch: torch.load alone may read data,
    so the stacks alone do not call it a model's load (LOOP001 names it); the hooks seeing
    every forward run by a new model, loaded from the same place, do."""
    shares = {"forward": 0.7, "load_whole": 0.25, "other": 0.05}
    bare = analyze(windows(Scenario(), shares=shares).host(0.3).process(0.95).tl)
    assert "INFER004" not in ids(bare) and "LOOP001" in ids(bare)
    sc = windows(Scenario(), shares=shares).host(0.3).process(0.95)
    a = analyze(_inference(sc, models=30, sources=1).tl)
    f = next(f for f in a.findings if f.id == "INFER004")
    assert f.impact == pytest.approx(0.25, abs=0.01) and "LOOP001" not in ids(a)


def test_a_function_that_loads_and_runs_the_model_counts_only_its_loading_lines():
    """embed() loads the model (line 12), runs it (14) and post-processes the output (16):
    its post-processing is not loading, whatever function it is in."""
    shares = {"embed_forward": 0.5, "load": 0.3, "embed_post": 0.2}
    a = analyze(windows(Scenario(), shares=shares).host(0.3).process(0.95).tl)
    f = next(f for f in a.findings if f.id == "INFER004")
    assert f.impact == pytest.approx(0.3, abs=0.01)


def test_a_loop_mostly_loading_is_still_a_loop_not_a_long_start_up():
    """70% of every window loading the model, 20% forwards: the forwards alone were under
    LOOP_SHARE, so the look's loop shrank to a few windows and the rest read as start-up (a
    `from_config` + `load_state_dict` job: INFER004 at 21% in one look, 25% in another, over
    a loop of 3 s of 26). Judged on what it does besides loading, every window is the loop."""
    sc = Scenario()
    sc.window(shares={"load": 0.9, "other": 0.1})  # start-up: loading the model once
    for fwd in (0.2, 0.2, 0.2, 0.2, 0.2, 0.3, 0.2, 0.2):  # one window's forwards over a quarter
        sc.window(shares={"forward": fwd, "load": 0.9 - fwd, "other": 0.1})
    # the forwards from the end of the start-up window (3 s) to the last loop window's (27 s)
    a = analyze(
        _inference(sc.host(0.3).process(0.95), models=40, sources=1, start_s=2.5, seconds=24.5).tl
    )
    assert a.phases["loop_s"] >= 5 * a.phases["startup_s"] > 0
    f = next(f for f in a.findings if f.id == "INFER004")
    assert f.impact == pytest.approx(0.7, abs=0.02)
