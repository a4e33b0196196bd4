"""End to end: `gpudiag run` on a fine-tuning loop whose dataset was padded once to a fixed
length (`tests/workloads/finetune_hf.py --pad-max 128`, run_glue.py's default
`--pad_to_max_length`): the hooks sample the training forwards' attention masks (the global
forward hooks are out after the first optimizer step; the model keeps a pre-hook of its own),
and INFER003 names the padding in training with the collator's fix first; the same loop padding
each batch to its longest row gets no INFER003."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import WORKLOADS, gpudiag
from tests.job_findings import job_ids

pytest.importorskip("transformers")


def _run(tmp_path, *flags: str) -> dict:
    out = tmp_path / "r.json"
    job = [sys.executable, str(WORKLOADS / "finetune_hf.py"), "--seconds", "12"]
    job += ["--batch-size", "8", *flags]
    res = gpudiag("run", "-q", "--out", str(out), "--", *job, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize("pad_max", [True, False], ids=["max_length", "longest"])
def test_training_forwards_padding_is_counted_and_named_only_where_it_is(tmp_path, pad_max):
    doc = _run(tmp_path, *(["--pad-max", "128"] if pad_max else []))
    m = doc["metrics"]
    assert doc["workload"]["kind"] == "training" and m["padded_forwards"] >= 10
    if pad_max:
        assert m["padded_length_mean"] == 128.0 and m["padding_beyond_longest_share"] > 0.5
        f = next(f for f in doc["findings"] if f["id"] == "INFER003")
        assert f["severity"] == "warning" and f["fix"] == {"kind": "padding", "values": {}}
        assert "DataCollatorWithPadding" in f["recommendation"]["actions"][0]
        assert "training forwards, sampled" in f["message"]
        assert f["speedup_low"] > 1.5
    else:
        assert m["padding_beyond_longest_share"] == 0.0 and "INFER003" not in job_ids(doc)
