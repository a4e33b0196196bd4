"""EVAL001 (evaluation inside the training loop) over scripted timelines: its interval from the
hooks or the episodes, and the evaluations that are not it (a little, an evaluation job)."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.findings.evaluation import EvalTime, nice_ceil, share_after, trial_fix
from gpudiag.probes.base import Sample
from gpudiag.probes.stacks.pyspy_output import episode_anchor, is_eval_frame
from tests.analyzers.scenario import LOOP, SITE, STACKS, Scenario
from tests.analyzers.test_findings import HEALTHY, ids, windows

EVAL = (
    f"{LOOP};evaluate (/work/train.py:90);Module._wrapped_call_impl "
    f"({SITE}/torch/nn/modules/module.py:1511);Net.forward (/work/model.py:20)"
)

STACKS["eval"] = EVAL  # an evaluation pass's forward: a "forward" sample under evaluate()

TRAIN = {"forward": 0.12, "backward": 0.18, "optimizer": 0.05, "data_wait": 0.02}


def steps(sc: Scenario, times: list[float], waits: list[float] | None = None) -> Scenario:
    """Hooks step rows with these wall times (and DataLoader waits), spread over the windows
    written."""
    waits = waits or [0.0] * len(times)
    for t, v, w in zip(sc._times(len(times), 10_000_000), times, waits, strict=True):
        sc.tl.add(Sample("hooks", t, {"kind": "step"}, {"step_time_s": v, "data_wait_s": w}))
    return sc


def evaluating(eval_share: float, hooks: bool = True, timed: float | None = None) -> Scenario:
    """Stack samples `eval_share` under evaluate(); with hooks, every 10th step carries a pass
    whose share of the timed steps is `timed` (default: the samples' share)."""
    shares = {k: v * (1 - eval_share) / sum(TRAIN.values()) for k, v in TRAIN.items()}
    sc = windows(Scenario(), shares=shares | {"eval": eval_share}).host(0.3).process(0.95)
    if hooks:  # every 10th step carries a pass: 9 steps of 0.1 s, then one of 0.1 + E
        t = eval_share if timed is None else timed
        per_pass = t / (1 - t) * 1.0
        steps(sc, ([0.1] * 9 + [0.1 + per_pass]) * 15)
    return sc


def test_evaluation_every_10_steps_is_eval001_with_its_interval():
    a = analyze(evaluating(0.64).tl)
    f = a.findings[0]
    assert f.id == "EVAL001"
    assert f.impact == pytest.approx(0.64, abs=0.02)
    ev = {e.metric: e for e in f.evidence}
    assert ev["eval_share"].setting == "eval_share_warn"
    assert ev["steps_between_evaluations"].value == pytest.approx(10, abs=0.5)
    assert ev["seconds_per_evaluation"].value == pytest.approx(1.78, rel=0.1)
    # 10 steps of training between passes -> 0.64 * 0.9 / (0.36 * 0.1) = 16x: every 160 -> 200
    assert "every 200 steps instead of every 10" in f.recommendation.actions[0]
    assert ev["eval_share_after_fix"].value <= 0.10
    assert str(f.location) == "/work/train.py:40:train"
    assert f.expected_speedup == pytest.approx((1 - 0.082) / 0.36, rel=0.05)
    # the trial that measures it: the evaluation function run every 20th call (200 / 10)
    assert f.fix == {"kind": "thin", "target": "train.evaluate", "values": {"every": 20}}
    assert "gpudiag try --fix thin:train.evaluate:every=20" in f.recommendation.actions[1]


def test_a_librarys_evaluation_is_tried_by_its_modules_dotted_name():
    """Hugging Face's Trainer.evaluate (sentence-transformers' training_stsbenchmark.py
    evaluates every 100 steps): thin:transformers.trainer.evaluate, found in that file."""
    lib = f"{SITE}/transformers/trainer.py"
    et = EvalTime(10.0, 0.3, "evaluate", None, lib)
    fix = trial_fix(et, 4.0)
    assert fix == {
        "kind": "thin",
        "target": "transformers.trainer.evaluate",
        "values": {"every": 4},
    }
    assert trial_fix(EvalTime(10.0, 0.3, "<lambda>", None, lib), 4.0) is None


def test_evaluation_without_hooks_takes_its_interval_from_the_episodes():
    sc = evaluating(0.5, hooks=False)
    anchor = f"{LOOP};evaluate (/work/train.py)"
    for _ in range(5):
        sc.tl.add(
            Sample(
                "stacks",
                sc.t,
                {
                    "mode": "all",
                    "kind": "episode",
                    "pid": "100",
                    "tid": "100",
                    "anchor": anchor,
                    "thread": "MainThread",
                },
                {"episodes": 1, "count": 150},
            )
        )
    f = next(f for f in analyze(sc.tl).findings if f.id == "EVAL001")
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["evaluations_seen"] == 5 and ev["seconds_between_evaluations"] == 3.0
    assert "s of training instead of every 3 s" in f.recommendation.actions[0]


def test_evaluation_is_judged_on_the_hooks_share_it_reports():
    """training_stsbenchmark.py: 13% of the stack samples under Trainer.evaluate, 21% of the
    timed steps' wall time in the long steps that carry its passes: judged on the 21% it
    reports (the gate read the samples' 13% and said nothing)."""
    f = next(f for f in analyze(evaluating(0.13, timed=0.21).tl).findings if f.id == "EVAL001")
    ev = {e.metric: e for e in f.evidence}
    assert ev["eval_share"].value == pytest.approx(0.21, abs=0.01)
    assert ev["eval_share"].source == "hooks"
    # long steps far beyond the samples under evaluation hold something else (a save): the
    # samples' share decides
    assert "EVAL001" not in ids(analyze(evaluating(0.08, timed=0.30).tl))


def test_a_little_evaluation_or_an_evaluation_job_is_not_eval001():
    assert "EVAL001" not in ids(analyze(evaluating(0.08).tl))
    only_eval = windows(Scenario(), shares={"eval": 0.9, "data_wait": 0.1}).host(0.3).process(0.9)
    assert "EVAL001" not in ids(analyze(only_eval.tl))  # nothing trains: evaluating is the job
    assert "EVAL001" not in ids(analyze(windows(Scenario(), shares=HEALTHY).host(0.3).tl))


def test_eval_frames_name_evaluation_not_training():
    assert is_eval_frame("evaluate (/w/t.py:3)") and is_eval_frame("run_validation (/w/t.py:3)")
    assert is_eval_frame("val_epoch (/w/t.py:3)")
    assert not is_eval_frame("train_and_evaluate (/w/t.py:3)")
    assert not is_eval_frame("_validate_args (/v/site-packages/torch/distributions/d.py:3)")
    assert not is_eval_frame("get_val (/w/t.py:3)")
    # one pass is one episode, whatever it calls inside
    frames = tuple(EVAL.split(";"))
    assert episode_anchor(frames) == f"{LOOP};evaluate (/work/train.py)"


def test_interval_arithmetic():
    assert nice_ceil(101) == 150 and nice_ceil(160) == 200 and nice_ceil(0.5) == 1
    assert share_after(0.64, 10) == pytest.approx(0.64 / (0.64 + 3.6))


def test_a_function_decorated_with_no_grad_is_an_evaluation_pass_whatever_its_name():
    """nanoGPT's estimate_loss (@torch.no_grad()): torch's decorator frame marks it."""
    from gpudiag.probes.stacks.pyspy_output import eval_frame_index

    site = "/v/lib/python3.11/site-packages/torch"
    frames = (
        "<module> (/w/train.py:181)",
        f"context_decorator.<locals>.decorate_context ({site}/utils/_contextlib.py:124)",
        "estimate_loss (/w/train.py:158)",
        f"Module._wrapped_call_impl ({site}/nn/modules/module.py:1778)",
    )
    assert eval_frame_index(frames) == 2
    assert eval_frame_index((frames[0], "estimate_loss (/w/train.py:158)")) is None


def test_one_stray_backward_sample_under_evaluate_does_not_hide_evaluation():
    """py-spy reads stacks without pausing the job: one torn sample that shows evaluate()
    above a backward frame must not make evaluate() a training function."""
    from gpudiag.analyzers.findings.evaluation import eval_time
    from gpudiag.analyzers.measures.loop import profile_loop
    from gpudiag.analyzers.measures.rules import Classifier
    from gpudiag.analyzers.timeline.timeline import Timeline
    from gpudiag.probes.base import Sample

    site = "/v/lib/python3.11/site-packages/torch"
    ev = "<module> (/w/t.py:40);evaluate (/w/t.py:10)"
    stacks = {
        f"{ev};Module._call_impl ({site}/nn/modules/module.py:1789)": 60,
        f"{ev};backward ({site}/autograd/__init__.py:266)": 1,
        f"<module> (/w/t.py:41);backward ({site}/autograd/__init__.py:266)": 30,
    }
    tl = Timeline()
    for stack, n in stacks.items():
        labels = {"mode": "all", "kind": "stack", "pid": "1", "tid": "1", "thread": "MainThread",
                  "role": "target", "stack": stack, "code": ""}  # fmt: skip
        tl.add(Sample("stacks", 10**12, labels, {"count": n}))
    clf = Classifier()
    view = tl.whole()
    got = eval_time(view, profile_loop(view, clf), clf)
    assert got is not None and got.function == "evaluate" and got.samples == 61
