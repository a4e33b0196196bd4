"""End to end: `gpudiag run` on the planted embedding job padding every row to a fixed length
(`tests/workloads/embed_hf.py --pad-max 128`): the hooks count the forwards' attention masks in
the job, the channel carries them, INFER003 names the padding with `padding=True` as the fix;
the same job padding each batch to its longest row gets no warning."""

from __future__ import annotations

import pytest

from tests.conftest import run_embed_hf
from tests.job_findings import first_job_finding, job_ids

pytest.importorskip("transformers")


@pytest.mark.parametrize("pad_max", [True, False], ids=["max_length", "longest"])
def test_run_counts_the_padding_and_names_it_only_where_it_is(tmp_path, pad_max):
    doc = run_embed_hf(tmp_path, 10, *(["--pad-max", "128"] if pad_max else []))
    m = doc["metrics"]
    assert doc["workload"]["kind"] == "inference" and m["padded_forwards"] >= 10
    if pad_max:  # named, first among the job's causes (a busy box may add its HOST002)
        assert m["padded_length_mean"] == 128.0 and m["padding_beyond_longest_share"] > 0.5
        f = first_job_finding(doc, "INFER003")
        assert "padding=True" in f["recommendation"]["actions"][0]
    else:
        assert m["padding_beyond_longest_share"] == 0.0 and "INFER003" not in job_ids(doc)
