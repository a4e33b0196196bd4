"""Plain `attach` (py-spy stacks, no hooks in the job) splits the model's time by module call
site (issue 55): on a planted job whose waste is one module's forward, that module's call
site leads the forward's rows; the verdict names it and is never a sure "no bottleneck"."""

from __future__ import annotations

import pytest

from gpudiag.agent.output.report import load_report
from tests.conftest import WORKLOADS, gpudiag, start_training

JOB = str(WORKLOADS / "compute_open_world.py")


@pytest.mark.long
def test_plain_attach_names_the_planted_heads_call_site(tmp_path):
    """lm_head: a head of 8,000 outputs over every position, called at LastTokenLM.forward's
    `return self.head(x)[:, -1]`: the split's top forward row is that call (not exact
    shares: the box may be busy)."""
    out = tmp_path / "report.json"
    job = start_training([JOB, "lm_head", "--seconds", "90"], tmp_path / "ready")
    try:
        res = gpudiag("attach", str(job.pid), "-q", "--duration", "12", "--out", str(out),
                      timeout=180)  # fmt: skip
    finally:
        job.kill()
        job.wait()
    assert res.returncode == 0, res.stderr
    doc = load_report(str(out))
    cs = doc["compute_stacks"]
    assert cs["source"] == "stacks" and cs["time"] == "cpu"
    fwd = [r for r in cs["rows"] if r["kind"] in ("call", "own")]
    top = fwd[0]
    assert (top["kind"], top["module"]) == ("call", "Linear"), fwd[:3]
    assert top["site"]["function"] == "LastTokenLM.forward", fwd[:3]
    assert top["site"]["file"].endswith("compute_open_world.py")
    assert top["call"] == "return self.head(x)[:, -1]  # the planted head over every position"
    v = doc["verdict"]
    if v["finding"] is None:  # (a busy box's HOST002 may lead: true, and no failure)
        assert not v["sure"] and "`return self.head(x)[:, -1]" in v["statement"], v
        assert "gpudiag attach --hooks PID" in v["statement"]
    else:
        assert v["finding"] == "HOST002", v
