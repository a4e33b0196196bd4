"""End to end: the benchmarks run and give what they promise (slow: run with -m slow)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.agent.test_benchmarks import BENCH
from tests.conftest import gpudiag


@pytest.mark.slow
def test_synthetic_recording_replays_with_its_planted_starvation(tmp_path):
    out = tmp_path / "syn.jsonl.gz"
    res = subprocess.run(
        [
            sys.executable,
            str(BENCH / "synthetic_recording.py"),
            "--hours",
            "0.1",
            "--starved-after-h",
            "0.02",
            "--out",
            str(out),
            "--replay",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "rows" in res.stdout and "MiB on disk" in res.stdout
    assert "s CPU, peak RSS" in res.stdout and "top finding DATA001" in res.stdout
    rep = gpudiag("replay", str(out), "--format", "json", timeout=300)
    assert rep.returncode == 0, rep.stderr
    doc = json.loads(rep.stdout.split("\nReport written")[0])
    assert len(doc["environment"]["gpus"]) == 8
    assert doc["findings"][0]["id"] == "DATA001"


@pytest.mark.slow
def test_agent_cost_benchmark_reports_cpu_and_rates():
    pytest.importorskip("torch")
    res = subprocess.run(
        [
            sys.executable,
            str(BENCH / "agent_cost.py"),
            "--seconds",
            "10",
            "--workers",
            "2",
            "--rounds",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "workers=2" in res.stdout and "% of a core" in res.stdout
    assert "stacks_loop_hz" in res.stdout


@pytest.mark.slow
def test_capture_benchmark_shows_the_speed_after_equals_before():
    pytest.importorskip("torch")
    res = subprocess.run(
        [sys.executable, str(BENCH / "capture_overhead.py"), "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("with capture: median"))
    assert 0.8 < float(line.rsplit(" ", 1)[1]) < 1.25
    assert "profiler on after: True" not in res.stdout


@pytest.mark.slow
def test_watch_cost_benchmark_measures_watch_over_its_jobs():
    pytest.importorskip("torch")
    res = subprocess.run(
        [sys.executable, str(BENCH / "watch_cost.py"), "--jobs", "2", "--seconds", "20"]
        + ["--settle", "10", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    (row,) = json.loads(res.stdout)
    assert row["jobs"] == 2 and row["jobs_shown"] == 2 and row["exit_status"] == 0
    assert 0 < row["cpu_cores_whole_run"] < 2 and row["peak_rss_mb"] > 10


@pytest.mark.slow
def test_stability_benchmark_counts_agreement_in_quick_mode(tmp_path):
    out = tmp_path / "stability.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "stability.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr
    assert "| workload | truth | mode | load | right |" in res.stdout
    assert "[1/8] starved_loader run idle #1" in res.stderr  # progress on stderr
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert {(r["workload"], r["mode"]) for r in rows} == {
        (w, m) for w in ("starved_loader", "sync_checkpoint") for m in ("run", "attach")
    }
    for r in rows:
        s = r["summary"]
        assert s["n"] == 2 and s["errors"] == 0, r["looks"]
        assert s["right"] + s["not_sure"] + s["wrong_sure"] == s["n"]
        assert s["wrong_sure"] == 0, r["looks"]  # never a confident wrong id


def test_stability_benchmark_refuses_bad_input():
    res = subprocess.run(
        [sys.executable, str(BENCH / "stability.py"), "--n", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().count("\n") == 0
