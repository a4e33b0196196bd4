"""HOST001 on the job's own per-step Python (issue 55): the fix follows from what its lines do
(incrementally, vectorised, once, every N steps) when it is not input loading, the speed-up is
the bound of removing its share, and a thin trial of its function measures it; input work done
inline keeps the DataLoader workers' fix."""

from __future__ import annotations

import pytest

from gpudiag.analyzers.measures.accounting import line_kind
from tests.analyzers.test_unexplained import run


@pytest.mark.parametrize(
    "code,kind",
    [
        ("ranked = sorted(window)", "recomputed"),
        ("total = sum(w for w in window)", "recomputed"),
        ("for rank, (score, label) in enumerate(ranked, 1):", "loop"),
        ("ema = copy.deepcopy(model)", "rebuilt"),
        ("index = {k: v for k, v in rows}", "rebuilt"),
        ("words = text.lower().split()", "other"),
        ("batch = transform(image)", "input"),
    ],
)
def test_what_a_line_does_is_read_from_its_text(code, kind):
    assert line_kind(code) == kind


def test_a_metric_recomputed_over_a_window_is_made_incremental_and_thinned_in_a_trial():
    a = run({"metric": 0.6})
    f = a.findings[0]
    assert f.id == "HOST001" and f.location.function == "rolling_auc"
    assert "not input loading" in f.message and "sorted(window)" in f.message
    assert f.recommendation.actions[0].startswith("compute rolling_auc incrementally")
    assert not any("num_workers" in x for x in f.recommendation.actions)
    assert f.speedup_kind == "bound"
    share = 0.6 / 1.1  # of the scenario's loop (its training shares sum to 0.5)
    assert f.expected_speedup == pytest.approx(1 / (1 - share), rel=0.05)
    assert f.fix["kind"] == "thin" and f.fix["target"] == "train.rolling_auc"
    assert f"every={f.fix['values']['every']}" in f.recommendation.actions[-1]


def test_a_structure_rebuilt_every_step_is_built_once():
    f = run({"rebuild": 0.5}).findings[0]
    assert f.id == "HOST001" and f.recommendation.actions[0].startswith("build what snapshot")
    assert f.fix["target"] == "train.snapshot"


def test_input_work_done_inline_keeps_the_workers_fix():
    f = run({"tokenize": 0.5}).findings[0]
    assert f.id == "HOST001" and f.fix is None
    assert any("num_workers" in x for x in f.recommendation.actions)
