"""Recorded looks at text generation one prompt at a time (`benchmarks/generate_heldout.py`:
Hugging Face's `generate()` per prompt, a small GPT-2 from its config, CPU), the 2-core box,
load 0.4-2.3. Timed bare over the same 48 prompts: 3.7 -> 0.7 s and 3.8 -> 0.8 s at 8
prompts a call, x4.9. With no GPU, INFER002 cannot judge a batch; before, `run` said a sure
"no bottleneck" on a job that batching moves x4.9."""

from __future__ import annotations

from pathlib import Path

from gpudiag.agent.cli.config import load_settings
from gpudiag.agent.commands.replay import replay_report

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "workloads"


def _replay(name: str) -> dict:
    return replay_report(str(FIXTURES / f"{name}.jsonl.gz"), load_settings(None))


def _generates(doc: dict) -> bool:
    return any(
        "generate(): each forward is one decoding step" in e for e in doc["workload"]["evidence"]
    )


def test_one_prompt_a_call_is_not_a_sure_no_bottleneck_and_says_how_to_find_out():
    doc = _replay("pub_generate_b1")
    assert doc["workload"]["kind"] == "inference" and _generates(doc)
    assert doc["findings"] == [] and not doc["verdict"]["sure"]
    assert "whether a larger batch pays (one item a forward" in doc["verdict"]["statement"]


def test_eight_prompts_a_call_is_a_sure_no_bottleneck():
    doc = _replay("pub_generate_b8")
    assert doc["workload"]["kind"] == "inference" and _generates(doc)
    assert doc["findings"] == [] and doc["verdict"]["sure"]
    assert doc["metrics"]["forward_batch_p50"] == 8.0


def test_attached_without_the_hooks_the_batch_is_not_judged():
    doc = _replay("pub_generate_b1_attach")
    assert _generates(doc) and not doc["verdict"]["sure"]
    assert "they need the in-process hooks" in doc["verdict"]["statement"]
