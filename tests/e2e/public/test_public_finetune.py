"""End to end (slow): TRL's own sft.py, run as its docstring runs it (tests/public/trl_sft/):
SFTConfig's default gradient checkpointing is named at the model with its recompute, carrying
the trial that measures it, and no 'loop over items'; the script's own fix flag
(`--gradient_checkpointing False`) leaves no recompute to name."""

from __future__ import annotations

import json

import pytest

from benchmarks.public_finetune import one_look

pytest.importorskip("trl")


@pytest.mark.slow
@pytest.mark.parametrize("fixed", [False, True], ids=["default", "no_checkpointing"])
def test_trl_sft_gradient_checkpointing_is_named_with_its_trial(tmp_path, fixed):
    out = tmp_path / "r.json"
    look = one_look("trl_sft", "run", 40.0, out, warmup=0.0, fixed=fixed)
    assert "error" not in look, look
    comp = [f for f in json.loads(out.read_text())["findings"] if f["id"] == "COMP001"]
    recompute = [f for f in comp if "recomputes its forward" in f["message"]]
    if fixed:
        assert not recompute
        return
    (f,) = recompute
    assert f["fix"] == {"kind": "recompute_off", "values": {}}
    assert "loop over items" not in f["message"] and f["expected_speedup"] < 1.6
