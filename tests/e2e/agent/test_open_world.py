"""End to end: planted causes inside the step that no rule names (issue 55's open world,
tests/workloads/compute_open_world.py), each named by COMP001 at its module or parameter group
from what the hooks read in the job's tensors, with the trial that measures it; the fixed job
and a healthy control are not. Figures: benchmarks/open_world.py, docs/how-it-measures.md."""

from __future__ import annotations

import json
import sys

import pytest

from gpudiag.agent.commands.tryfix import parse_fix
from gpudiag.agent.output.report import load_report
from gpudiag.agent.session.trial import check_fix
from tests.conftest import WORKLOADS, gpudiag_until_sure, start_training
from tests.job_findings import job_findings

pytest.importorskip("torch")
JOB = str(WORKLOADS / "compute_open_world.py")


def _comp001(doc: dict) -> dict:
    """COMP001, asserted the job's first finding (a HOST002 naming other processes aside)."""
    found = job_findings(doc)
    assert found and found[0]["id"] == "COMP001", [(f["id"], f["title"]) for f in found]
    return found[0]


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("freeze:backbone", {"kind": "freeze", "target": "backbone", "values": {}}),
        ("reuse:layers.0", {"kind": "reuse", "target": "layers.0", "values": {}}),
    ],
)
def test_a_module_fix_parses_and_passes_the_checks(text, fix):
    assert parse_fix(text) == fix and check_fix(fix, False) is None


@pytest.mark.parametrize("text", ["freeze:a..b", "reuse:0layer", "freeze:x;rm"])
def test_a_bad_module_path_is_one_line_and_exit_2(cli, text):
    r = cli("try", "--fix", text, "--", sys.executable, "-c", "pass")
    assert r.returncode == 2 and "expected" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cause", "named", "said", "fix"),
    [
        ("frozen_grad", "backbone", "no optimizer updates", "freeze:backbone"),
        ("dense_embed", "(optimizer) group 0", "embed.weight", "freeze:embed"),
        ("lm_head", "head", "zero gradient", "select:head"),
        ("sample_loop", "encoder", "times a step", "batched:encoder"),
        ("over_wide", "inp", "zero gradient", "select:inp"),
        (
            "pos_table",
            "(model's own code)",
            "a Python loop",
            "cache:compute_open_world.positional_table",
        ),
    ],
)
def test_run_names_the_cause_at_its_module(cause, named, said, fix, tmp_path):
    out = tmp_path / "report.json"
    res = gpudiag_until_sure(
        "run", "-q", "--duration", "20", "--out", str(out), "--",
        sys.executable, JOB, cause, "--seconds", "60",
        tmp=tmp_path, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    f = _comp001(load_report(str(out)))
    assert f"({named})" in f["title"] and said in f["message"], f["message"]
    assert f["severity"] == "warning" and f["speedup_kind"] == "model"
    got = f.get("fix")
    assert (None if got is None else f"{got['kind']}:{got['target']}") == fix
    if fix == "select:head":  # the span its gradient reaches: the last position along dim 1
        assert got["values"] == {"dim": 1, "start": -1, "length": 1}
    if fix == "select:inp":  # the layer's features read: the first 512 of 8192
        assert got["values"] == {"dim": -1, "start": 0, "length": 512}


@pytest.mark.slow
def test_attach_with_hooks_names_the_second_pass_and_its_trial_measures_it(tmp_path):
    out = tmp_path / "report.json"
    job = start_training([JOB, "twice", "--seconds", "90"], tmp_path / "ready")
    try:
        res = gpudiag_until_sure(
            "attach", str(job.pid), "--hooks", "-q", "--duration", "15", "--out", str(out),
            tmp=tmp_path, timeout=240,
        )  # fmt: skip
    finally:
        job.kill()
        job.wait()
    assert res.returncode == 0, res.stderr
    f = _comp001(load_report(str(out)))
    assert "(encoder)" in f["title"] and "already had in the same step" in f["message"]
    assert f["fix"] == {"kind": "reuse", "target": "encoder", "values": {}}
    trial = tmp_path / "trial.json"
    res = gpudiag_until_sure(
        "try", "--from", str(out), "--finding", "COMP001", "--rounds", "1", "--seconds", "3",
        "--warmup", "2", "--out", str(trial), "--", sys.executable, JOB, "twice",
        "--seconds", "600", tmp=tmp_path, timeout=300,
    )  # fmt: skip
    t = json.loads(trial.read_text())["trials"][0]
    assert "encoder returns its last output" in (t["applied"] or ""), t
    assert t["measured"] is not None  # its size is benchmarks/open_world.py's (no clock here)


@pytest.mark.slow
@pytest.mark.parametrize("cause", ["healthy", "twice --fixed"])
def test_the_fixed_job_and_a_healthy_one_get_no_comp001_warning(cause, tmp_path):
    out = tmp_path / "report.json"
    res = gpudiag_until_sure(
        "run", "-q", "--duration", "20", "--out", str(out), "--",
        sys.executable, JOB, *cause.split(), "--seconds", "60",
        tmp=tmp_path, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = load_report(str(out))
    assert not [f for f in job_findings(doc, serious=True) if f["id"] == "COMP001"], doc["findings"]
