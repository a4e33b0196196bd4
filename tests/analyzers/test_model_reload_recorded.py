"""INFER004 on recorded looks at code that loads its model for every chunk of texts
(`benchmarks/reload_heldout.py`: all-MiniLM-L6-v2 loaded inside `embed(texts)` through the
model card's `from_pretrained`, or sentence-transformers' constructor), under `run` and
`attach` (stacks alone), the 2-core box, load 1.6-2.1. The fix (the model loaded once) was
timed bare twice on the same box. Before INFER004 every look here read LOOP001 ("make
sentence_transformers...wrapper cheaper") or, at chunk 64, no bottleneck."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.agent.cli.config import load_settings
from gpudiag.agent.commands.replay import replay_report

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "workloads"
# the model loaded once, timed bare twice (sentences/s before -> after)
MEASURED = {
    # from_pretrained per chunk of 16: 102.5 -> 177.8, 113.6 -> 175.1
    "pub_reload_hf16": (1.54, 1.73),
    "pub_reload_hf16_attach": (1.54, 1.73),
    # SentenceTransformer(path) per chunk of 16: 108.9 -> 202.4, 106.2 -> 180.8
    "pub_reload_st16": (1.70, 1.86),
    "pub_reload_st16_attach": (1.70, 1.86),
    # per chunk of 64: 152.7 -> 176.1, 149.8 -> 169.8
    "pub_reload_st64": (1.13, 1.15),
}
WHERE = {"hf": "_hf_load", "st": "_st_load"}  # the function whose line loads the model


def _replay(name: str) -> dict:
    return replay_report(str(FIXTURES / f"{name}.jsonl.gz"), load_settings(None))


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_a_model_loaded_per_chunk_is_infer004_at_its_line_near_the_measured_fix(name: str):
    doc = _replay(name)
    assert doc["workload"]["kind"] == "inference"
    f = doc["findings"][0]
    assert f["id"] == "INFER004" and "LOOP001" not in [x["id"] for x in doc["findings"]]
    assert "reload_heldout.py:" in f["location"]
    assert f["location"].endswith(":" + WHERE[name.split("_")[2][:2]])
    low, high = MEASURED[name]
    # the loading alone (cold forwards not counted): within 12% under the fix's low end; over
    # its high end only by the sampled share's error (chunk 64: 15% loading on 687 samples,
    # x1.18 against x1.13-1.15 measured)
    assert low / 1.12 <= f["expected_speedup"] <= high * 1.03
    if name.endswith("16"):  # the hooks saw the same model loaded again and again
        assert doc["verdict"]["sure"] and doc["verdict"]["finding"] == "INFER004"
        assert doc["metrics"]["models_repeat_share"] > 0.9
    elif name.endswith("attach"):  # the stacks alone: the same model, or a sweep?
        assert not doc["verdict"]["sure"] and "attach --hooks" in doc["verdict"]["statement"]
    # the loading is the loop's "other", no forward
    assert doc["breakdown"]["shares"]["other"] >= f["impact"]


def test_a_sweep_over_checkpoints_is_not_infer004_and_its_loading_is_named():
    """`--sweep 1000`: each chunk loads another checkpoint (the hooks knew every source, none
    seen before): "load it once" would be wrong. The loading is still the loop's time, and
    LOOP001 names it, as before INFER004 (with the loading counted as start-up and hidden from
    LOOP001, a draft of this change read "no bottleneck", sure)."""
    doc = _replay("pub_reload_sweep")
    ids = [f["id"] for f in doc["findings"]]
    assert "INFER004" not in ids and ids[0] == "LOOP001" and doc["verdict"]["sure"]
    assert doc["metrics"]["models_repeat_share"] == 0.0 and doc["metrics"]["models_known"] >= 100
    assert "from_pretrained" in doc["findings"][0]["message"]
