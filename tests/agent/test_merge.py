"""`gpudiag merge`: per-host reports of one job into one job report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.agent.base.config import Settings
from gpudiag.agent.commands.replay import replay_report
from gpudiag.agent.output.report import load_report, write_report
from gpudiag.analyzers.model.thresholds import Thresholds

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100" / "healthy.jsonl.gz"


@pytest.fixture(scope="module")
def base() -> dict:
    return replay_report(str(FIXTURE), Settings(Thresholds(), (), None))


def host_report(base: dict, tmp: Path, name: str, rank: int, host: str, **parts: float) -> str:
    doc = json.loads(json.dumps(base))
    doc["environment"]["host"] = host
    bd = {"data": 0.0, "compute": 0.0, "copies": 0.0, "collectives": 0.0, "checkpoint": 0.0}
    bd.update(parts)
    bd["other"] = round(1.0 - sum(bd.values()), 6)
    doc["ranks"] = [
        {
            "rank": rank,
            "local_rank": 0,
            "world_size": 2,
            "pid": 1000 + rank,
            "host": host,
            "gpu": "0",
            "steps": 500,
            "step_time_s": 0.2,
            "breakdown": bd,
            "stack_samples": 400,
            "collective_share_hooks": None,
            "last_step_t": 1_800_000_000.0 + (2.5 if rank else 0.0),
        }
    ]
    path = tmp / name
    write_report(doc, path)
    return str(path)


def test_two_hosts_merge_into_one_job_view_with_the_straggler(base, tmp_path, cli):
    a = host_report(base, tmp_path, "a.json", 0, "node-a", compute=0.3, collectives=0.65)
    b = host_report(base, tmp_path, "b.json", 1, "node-b", data=0.6, compute=0.3)
    out = tmp_path / "job.json"
    res = cli("merge", a, b, "--out", str(out))
    assert res.returncode == 0, res.stderr
    doc = load_report(str(out))  # a valid report
    assert doc["run"]["mode"] == "merge"
    assert [(r["rank"], r["host"]) for r in doc["ranks"]] == [(0, "node-a"), (1, "node-b")]
    dist = [f for f in doc["findings"] if f["id"] == "DIST001"]
    assert dist and "rank 1 on node-b" in dist[0]["message"]
    assert doc["distributed"]["merged_from"] == [a, b]
    # same step count, node-b's last step 2.5 s later on its clock: its clock is 2.5 s ahead
    assert [r["clock_offset_s"] for r in doc["ranks"]] == [0.0, 2.5]
    assert "<- straggler" in res.stdout and "node-b" in res.stdout


def test_reports_without_ranks_are_one_rank_each(base, tmp_path, cli):
    paths = []
    for name in ("x.json", "y.json"):
        write_report(base, tmp_path / name)
        paths.append(str(tmp_path / name))
    res = cli("merge", *paths, "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert [r["report"] for r in doc["ranks"]] == paths
    assert doc["distributed"]["straggler"]  # decided, or why not


def test_bad_input_is_one_line(base, tmp_path, cli):
    a = host_report(base, tmp_path, "a.json", 0, "node-a", compute=0.9)
    twin = host_report(base, tmp_path, "twin.json", 0, "node-b", compute=0.9)
    res = cli("merge", a, twin)
    assert res.returncode == 2 and "rank 0 is in both" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = cli("merge", a)
    assert res.returncode == 2 and "at least two reports" in res.stderr
    res = cli("merge", a, str(tmp_path / "missing.json"))
    assert res.returncode == 2 and "not found" in res.stderr


def test_markdown_summary_has_the_rank_rows(base, tmp_path):
    from gpudiag.agent.output.render.text import render_markdown

    a = host_report(base, tmp_path, "a.json", 0, "node-a", compute=0.3, collectives=0.65)
    doc = load_report(a)
    md = render_markdown(doc)
    assert "```\nRanks (1)" in md and "node-a" in md


def test_the_merged_verdict_names_the_merged_top_finding(base, tmp_path, cli):
    """The first report was healthy; the second host's job waited on data: the merged report's
    verdict is the merged top finding, not the first report's (a bug: it kept docs[0]'s)."""
    a = host_report(base, tmp_path, "a.json", 0, "node-a", compute=0.9)
    b_doc = json.loads(
        Path(host_report(base, tmp_path, "b.json", 1, "node-b", compute=0.9)).read_text()
    )
    assert base["findings"], "the healthy fixture has notes to model a finding on"
    data = {**base["findings"][0], "id": "DATA001", "severity": "warning", "impact": 0.5}
    b_doc["findings"].insert(0, data)
    write_report(b_doc, tmp_path / "b.json")
    res = cli("merge", a, str(tmp_path / "b.json"), "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    loud = [f["id"] for f in doc["findings"] if f["severity"] in ("error", "warning")]
    assert loud and doc["verdict"]["finding"] == loud[0] == "DATA001"
    assert "merged from 2 reports" in doc["verdict"]["statement"]
