"""A sure "no bottleneck" needs the model's compute near what the device attains for its
shapes, where the hooks measured it (issue 55): otherwise the verdict says how far below and
where to look."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.engine.finalize import compute_left
from gpudiag.analyzers.model.catalogue import new_finding
from gpudiag.analyzers.model.results import Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.base import Sample
from tests.analyzers.scenario import Scenario

HEALTHY = {"forward": 0.35, "backward": 0.45, "optimizer": 0.15, "data_wait": 0.03, "other": 0.02}
SURE = {"finding": None, "sure": True, "confidence": None, "statement": "no bottleneck"}


def table(eff: float | None, source: str = "calibration", counted: int = 1) -> dict:
    """The report's compute table, as much of it as the verdict reads."""
    return {
        "counted_steps": counted,
        "model_efficiency": eff,
        "attainable": {"flops_s": 1e11, "bytes_s": 1e10, "dtype": "float32", "source": source},
        "rows": [
            {"name": "blocks.0", "kind": "unit", "share": 0.7},
            {"name": "(outside the model)", "kind": "outside", "share": 0.3},
        ],
    }


def test_compute_far_below_the_device_makes_no_bottleneck_not_sure():
    v = compute_left(SURE, table(0.1), None, Thresholds())
    assert v["sure"] is False and v["finding"] is None
    assert "runs at 10% of what this CPU attains for its shapes" in v["statement"]
    assert "model's compute (70% of the step)" in v["statement"]
    assert "comp_verdict_efficiency=0.25" in v["statement"]


@pytest.mark.parametrize(
    ("compute", "runqueue"),
    [
        (table(0.6), None),  # near what the CPU attains
        (table(0.12), 0.7),  # 40% of its time on the CPU: the rest it waited for one
        (table(0.05, "datasheet H100 SXM (bfloat16)"), None),  # a GPU: no rate for its shapes
        (table(None), None),  # work counted, no attainable rate to hold it against
        (None, None),  # no hooks
    ],
)
def test_a_sure_verdict_stays_sure_where_compute_is_near_the_device_or_not_measured(
    compute, runqueue
):
    assert compute_left(SURE, compute, runqueue, Thresholds()) == SURE


def test_a_look_with_no_counted_step_says_compute_was_not_judged():
    """Timed steps but no counted one (a short look): COMP001 could not be judged, so "no
    bottleneck" is not sure, and the statement says how to get it judged."""
    v = compute_left(SURE, table(None, counted=0), None, Thresholds())
    assert v["sure"] is False and v["finding"] is None
    assert "not judged: the step's compute against its work (COMP001)" in v["statement"]
    assert "10 s or more" in v["statement"]
    found = {**SURE, "finding": "HOST002"}
    assert compute_left(found, table(None, counted=0), None, Thresholds()) == found


def test_a_finding_keeps_its_verdict_and_the_threshold_is_a_setting():
    found = {**SURE, "finding": "DATA001"}
    assert compute_left(found, table(0.01), None, Thresholds()) == found
    low = replace(Thresholds(), comp_verdict_efficiency=0.05)
    assert compute_left(SURE, table(0.1), None, low) == SURE


def test_a_compute_note_left_unexplained_makes_no_bottleneck_not_sure():
    """COMP001 with no reason read is a note: "no bottleneck" beside it is not sure, named."""
    th = Thresholds()
    note = new_finding(
        "COMP001",
        th,
        note=True,
        detail="(embed)",
        impact=0.15,
        confidence=0.9,
        message="",
        evidence=(),
        recommendation=Recommendation("", ()),
        expected_speedup=1.18,
    )
    assert note.severity == "note" and "no reason read" in note.title
    v = compute_left(SURE, table(0.6), None, th, [note])
    assert v["sure"] is False
    assert "15% of the step is left unexplained" in v["statement"] and "(embed)" in v["statement"]
    assert compute_left({**SURE, "finding": "HOST002"}, None, None, th, [note])["finding"]


def timed(counted: dict, rate: float = 1e9, n: int = 4) -> list[dict]:
    """Timed records of a steady model whose every unit runs its counted work at `rate`
    (FLOP/s and B/s): the times a quiet box gives, without its noise."""
    units = [
        [w[0], (w[1] / rate + w[4] / rate), (w[2] / rate + w[5] / rate), 1]
        for w in counted["work"]
        if not w[0].startswith("(")
    ]
    model = sum(u[1] + u[2] for u in units)
    rec = {"count": 0, "model": counted["model"], "device": "cpu", "units": units}
    rec |= {"fwd": sum(u[1] for u in units), "bwd": sum(u[2] for u in units)}
    rec |= {"opt": 0.01 * model, "own": 0.0, "step": 1.05 * model, "groups": counted["groups"]}
    return [dict(rec) for _ in range(n)]


def test_analyze_holds_the_hooks_compute_table_against_the_calibration():
    """End to end: a healthy scripted loop with a real model's counted step and steady timed
    steps is sure; the same with a calibration far above what its units reach is not, and
    says so."""
    torch = pytest.importorskip("torch")
    from gpudiag.probes.inprocess.compute_rows import compute_samples
    from tests.probes.test_compute_hooks import Net, _train

    torch.manual_seed(0)
    counted = [r for r in _train(Net(), 2, counting=True) if r["count"]]
    recs = counted + timed(counted[-1])
    verdicts = {}
    for rate in (None, 1e15):
        sc = Scenario()
        for _ in range(5):
            sc.window(HEALTHY)
        sc.host(0.3).process(0.95)
        for i, rec in enumerate(recs):
            t = sc.t0 + (i + 1) * (sc.t - sc.t0) // (len(recs) + 2)
            sc.tl.extend(compute_samples({"cmp": [{**rec, "t": t / 1e9}]}))
        if rate is not None:
            labels = {"kind": "calibration", "dtype": "float32", "device": "cpu"}
            for op in ("gemm", "copy"):
                sc.tl.add(Sample("hooks", sc.t0 + 1, {**labels, "op": op}, {"calib_rate": rate}))
        a = analyze(sc.tl)
        assert a.compute and a.compute["model_efficiency"] is not None
        verdicts[rate] = a.verdict
    assert verdicts[None]["sure"] is True, verdicts[None]
    assert verdicts[1e15]["sure"] is False
    assert "of what this CPU attains for its shapes" in verdicts[1e15]["statement"]


def test_a_training_loop_seen_by_stacks_alone_never_gets_a_sure_no_bottleneck():
    """Plain attach read a sure "no bottleneck" on five planted jobs whose fixes moved them x4.7
    to x54 (lm_head, over_wide, dense_embed, sample_loop, const_encode); attach --hooks named
    each. Without the hooks' compute table the verdict is not sure and says how to measure."""
    from gpudiag.analyzers.engine.finalize import compute_unread

    class Profile:
        def share(self, cat: str) -> float:
            return {"forward": 0.4, "backward": 0.5, "optimizer": 0.05}.get(cat, 0.0)

    v = compute_unread(SURE, "training", None, Profile())
    assert v["sure"] is False and "95% of the loop" in v["statement"]
    assert compute_unread(SURE, "training", table(0.6), Profile()) == SURE  # measured
    assert compute_unread(SURE, "inference", None, Profile()) == SURE  # no step to judge
    found = {**SURE, "finding": "DATA001"}
    assert compute_unread(found, "training", None, Profile()) == found
