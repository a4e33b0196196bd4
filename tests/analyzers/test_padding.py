"""INFER003 over scripted timelines: the forwards' attention masks counted by the hooks.
Rows padded past each batch's longest (`padding="max_length"`) or batches of unlike lengths
are named with the fix and its range; padding to the longest over like lengths is healthy."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.thresholds import Thresholds
from tests.analyzers.scenario import Scenario, hook_padding, hook_serving, server_windows
from tests.analyzers.test_findings import ids, windows


def embedding_loop(**padding) -> Scenario:
    """A batch-embedding loop 90% in its forwards: 60 batches of 32 a second, autograd off."""
    sc = windows(Scenario(), shares={"forward": 0.9, "other": 0.1}).host(0.3).process(0.95)
    sc = hook_serving(sc, rate=1920.0, forward_s=0.015, batch=32.0, grad=0.0, requests=False)
    return hook_padding(sc, **padding)


def test_rows_padded_to_a_fixed_length_are_infer003_with_the_longest_as_the_fix():
    a = analyze(embedding_loop(padded=256.0, longest=40.0, real=26.0).tl)
    assert a.workload.kind == "inference" and ids(a) == ["INFER003"]
    f = a.findings[0]
    assert f.evidence[0].metric == "padding_beyond_longest_share"
    assert f.evidence[0].setting == "pad_beyond_warn"
    assert f.evidence[0].value == pytest.approx(1 - 40 / 256, abs=1e-3)
    assert a.metrics["padding_share"] == pytest.approx(1 - 26 / 256, abs=1e-3)
    assert f.recommendation.summary == "Pad each batch to its longest row, not a fixed length"
    assert "padding=True" in f.recommendation.actions[0]
    assert 'padding="max_length" (every row to 256 tokens)' in f.recommendation.actions[0]
    # the forwards 90% of the loop, cut to 40/256 of their tokens: linear to quadratic; the
    # low end with the lower of the stacks' forward share and the hooks' timing
    busy = a.metrics["forward_concurrency"]
    assert busy == pytest.approx(0.9, abs=0.02)
    low = min(busy, a.breakdown.shares["forward"])
    assert f.speedup_low == pytest.approx(1 / (1 - low * (1 - 40 / 256)), rel=1e-3)
    assert f.expected_speedup == pytest.approx(1 / (1 - busy * (1 - (40 / 256) ** 2)), rel=1e-3)
    assert a.metrics["padded_length_sq_mean"] == pytest.approx(256.0**2)
    assert f.speedup_kind == "hypothesis" and f.severity == "warning"


def test_padding_to_each_batchs_longest_over_like_lengths_is_healthy():
    """The model card's way (padding=True): 37% padding, nothing past the longest."""
    a = analyze(embedding_loop(padded=41.0, longest=41.0, real=26.0).tl)
    assert ids(a) == [] and a.metrics["padding_share"] == pytest.approx(15 / 41, abs=1e-3)
    assert a.metrics["padding_beyond_longest_share"] == 0.0


def test_batches_of_unlike_lengths_are_infer003_with_their_sorted_batches_as_the_fix():
    """The model card's loop over docstring sentences: padded to each batch's longest, 154
    tokens a row, 34 real, 59 sorted by length (measured bare: x3.0 sorted)."""
    a = analyze(embedding_loop(padded=154.0, longest=154.0, real=34.0, sorted_len=59.0).tl)
    assert ids(a) == ["INFER003"]
    f = a.findings[0]
    assert f.evidence[0].metric == "padding_share" and f.evidence[0].setting == "pad_share_warn"
    assert f.recommendation.summary == "Batch rows of like lengths together"
    assert "sort the texts by length" in f.recommendation.actions[0]
    assert (
        "cut to 59 (sorted by their token length, the last rows batched alike)" in f.speedup_basis
    )
    low = min(a.metrics["forward_concurrency"], a.breakdown.shares["forward"])
    assert f.speedup_low == pytest.approx(1 / (1 - low * (1 - 59 / 154)), rel=1e-3)


def test_without_the_sorted_summary_the_real_length_is_the_bound():
    a = analyze(embedding_loop(padded=100.0, longest=100.0, real=30.0).tl)
    assert ids(a) == ["INFER003"]
    assert "cut to 30 (sorted by length: the real length, a bound)" in a.findings[0].speedup_basis


def test_unlike_lengths_that_sorting_would_not_shorten_are_not_named():
    """Half the tokens padding, but the rows sorted by length still pad to 85 of 100."""
    a = analyze(embedding_loop(padded=100.0, longest=100.0, real=45.0, sorted_len=85.0).tl)
    assert ids(a) == []


def test_a_batch_one_server_padding_each_request_is_infer003_with_the_servers_actions():
    sc = hook_serving(server_windows(Scenario(), forward=0.8), rate=50.0, latency_s=0.01, grad=0.0)
    a = analyze(hook_padding(sc, rows=1.0, padded=512.0, longest=20.0, real=20.0).tl)
    assert a.workload.kind == "server" and "INFER003" in ids(a)
    f = next(f for f in a.findings if f.id == "INFER003")
    assert "a request of one row needs no padding" in f.recommendation.actions[2]


def test_too_few_masks_counted_are_not_judged():
    th = Thresholds()
    a = analyze(embedding_loop(forwards=th.pad_min_forwards - 1, padded=256.0).tl)
    assert ids(a) == [] and a.metrics["padded_forwards"] == th.pad_min_forwards - 1


def test_a_job_whose_forwards_have_no_mask_has_no_padding_metric():
    sc = windows(Scenario(), shares={"forward": 0.9, "other": 0.1}).host(0.3).process(0.95)
    sc = hook_serving(sc, rate=1920.0, forward_s=0.015, batch=32.0, grad=0.0, requests=False)
    a = analyze(sc.tl)
    assert ids(a) == [] and "padding_share" not in a.metrics
