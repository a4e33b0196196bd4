"""Recorded looks at one item a forward on a CPU: text generation one prompt a call
(`benchmarks/generate_heldout.py`: Hugging Face's `generate()`, a small GPT-2 from its config)
and sentence-transformers' `encode()` one sentence a call (`benchmarks/encode_each_heldout.py`),
the 2-core box, load 0.4-2.3. Timed bare over the same inputs: 8 prompts a call 3.7 -> 0.7 s
and 3.8 -> 0.8 s (x4.9); 256 sentences a call 7.9 -> 3.7 s and 7.8 -> 3.6 s (x2.1-2.2). With
no GPU, INFER002 cannot judge a batch; before, `run` said a sure "no bottleneck" on both."""

from __future__ import annotations

from tests.analyzers.recorded import replay_workload


def _generates(doc: dict) -> bool:
    return any(
        "generate(): each forward is one decoding step" in e for e in doc["workload"]["evidence"]
    )


def test_one_prompt_a_call_is_not_a_sure_no_bottleneck_and_says_how_to_find_out():
    doc = replay_workload("pub_generate_b1")
    assert doc["workload"]["kind"] == "inference" and _generates(doc)
    assert doc["findings"] == [] and not doc["verdict"]["sure"]
    assert "whether a larger batch pays (one item a forward" in doc["verdict"]["statement"]


def test_eight_prompts_a_call_is_a_sure_no_bottleneck():
    doc = replay_workload("pub_generate_b8")
    assert doc["workload"]["kind"] == "inference" and _generates(doc)
    assert doc["findings"] == [] and doc["verdict"]["sure"]
    assert doc["metrics"]["forward_batch_p50"] == 8.0


def test_attached_without_the_hooks_the_batch_is_not_judged():
    doc = replay_workload("pub_generate_b1_attach")
    assert _generates(doc) and not doc["verdict"]["sure"]
    assert "they need the in-process hooks" in doc["verdict"]["statement"]


def test_encode_one_sentence_a_call_is_not_a_sure_no_bottleneck():
    doc = replay_workload("pub_encode_each")
    assert doc["workload"]["kind"] == "inference" and doc["findings"] == []
    assert doc["metrics"]["forward_batch_p50"] == 1.0 and not doc["verdict"]["sure"]
    assert "whether a larger batch pays" in doc["verdict"]["statement"]
