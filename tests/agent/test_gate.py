"""`gpudiag gate`: verdicts and exit codes on saved reports and on real runs."""

from __future__ import annotations

import json
import time

import pytest

from gpudiag.agent.output.report import RunInfo, build_report, write_report
from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.thresholds import Thresholds
from tests.analyzers.test_throughput import hook_timeline

ENV = {"host": "ci", "cpu_count": 2, "python": "3.11", "torch": "2.13.0", "gpus": []}


def report(tmp_path, name: str, dt: float, env: dict | None = None) -> str:
    now = time.time()
    doc = build_report(
        analysis=analyze(hook_timeline(dt=dt)),
        run_info=RunInfo("run", ["x"], 1, now - 10, now, "target_exited", 0),
        environment=env or ENV,
        probes=[],
        errors=[],
        thresholds=Thresholds(),
    )
    return str(write_report(doc, tmp_path / name))


def test_saved_reports_pass_and_fail(cli, tmp_path):
    base = report(tmp_path, "base.json", 0.1)
    same = [report(tmp_path, f"s{i}.json", 0.1 * (1 + 0.01 * i)) for i in range(3)]
    slow = [report(tmp_path, f"w{i}.json", 0.15 * (1 + 0.01 * i)) for i in range(3)]
    res = cli("gate", "--baseline", base, "--out", str(tmp_path / "g.json"), *same)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gpudiag gate: PASS" in res.stdout
    res = cli(
        "gate",
        "--baseline",
        base,
        "--out",
        str(tmp_path / "g.json"),
        "--junit-xml",
        str(tmp_path / "j.xml"),
        *slow,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert "REGRESSION steps_per_second" in res.stdout and "95% interval" in res.stdout
    assert '<failure message="steps_per_second' in (tmp_path / "j.xml").read_text()
    gate = json.loads((tmp_path / "g.json").read_text())["gate"]
    assert gate["verdict"] == "fail"
    res = cli("gate", "--baseline", base, "--exit-zero", "--out", str(tmp_path / "g.json"), *slow)
    assert res.returncode == 0


def test_different_environment_is_not_comparable(cli, tmp_path):
    base = report(tmp_path, "base.json", 0.1)
    other = report(tmp_path, "o.json", 0.1, dict(ENV, torch="2.9.1"))
    res = cli("gate", "--baseline", base, "--out", str(tmp_path / "g.json"), other)
    assert res.returncode == 3 and "not comparable" in res.stdout and "torch" in res.stdout


def github(monkeypatch, summary) -> None:
    """The environment of a GitHub Actions step (gate reads it as it runs, in-process here)."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))


def test_github_annotations_and_step_summary(tmp_path, monkeypatch, cli):
    base = report(tmp_path, "base.json", 0.1)
    slow = [report(tmp_path, f"w{i}.json", 0.2 * (1 + 0.01 * i)) for i in range(3)]
    summary = tmp_path / "summary.md"
    github(monkeypatch, summary)
    res = cli(
        "gate",
        "--baseline",
        base,
        "--out",
        str(tmp_path / "g.json"),
        *slow,
    )
    assert res.returncode == 1
    assert res.stdout.index("::error title=gpudiag gate: steps_per_second") >= 0
    assert "| steps_per_second | FAIL |" in summary.read_text()


def with_metrics(path: str, **metrics: float) -> str:
    doc = json.loads(open(path).read())
    doc["metrics"].update(metrics)
    return str(write_report(doc, path))


def test_github_outputs_worst_first_with_limits_as_percentages(tmp_path, monkeypatch, cli):
    base = with_metrics(
        report(tmp_path, "base.json", 0.1), steps_per_second=10.0, step_time_p50_s=0.1
    )
    # steps/s down 20% (fails, listed first in metric order); p50 step time up 100% (worse)
    cur = [
        with_metrics(
            report(tmp_path, f"c{i}.json", 0.1),
            steps_per_second=8.0 + i / 100,
            step_time_p50_s=0.2 + i / 1000,
        )
        for i in range(3)
    ]
    summary = tmp_path / "summary.md"
    github(monkeypatch, summary)
    res = cli(
        "gate",
        "--baseline",
        base,
        "--out",
        str(tmp_path / "g.json"),
        *cur,
    )
    assert res.returncode == 1, res.stdout
    errors = [ln.split("::")[1] for ln in res.stdout.splitlines() if ln.startswith("::error")]
    assert errors == [
        "error title=gpudiag gate: step_time_p50_s regressed",
        "error title=gpudiag gate: steps_per_second regressed",
    ]
    rows = [ln for ln in summary.read_text().splitlines() if ln.startswith("| step")]
    assert rows[0].startswith("| step_time_p50_s | FAIL |")
    assert rows[1].startswith("| steps_per_second | FAIL |")
    for row in rows:
        assert row.endswith("| 10% |"), row  # the limit as the terminal shows it, not 0.1
    terminal = [ln for ln in res.stdout.splitlines() if ln.startswith("step")]
    assert terminal[0].startswith("step_time_p50_s") and terminal[0].endswith("10%")


def test_gate_options_after_the_report_files(cli, tmp_path):
    base = report(tmp_path, "base.json", 0.1)
    same = [report(tmp_path, f"s{i}.json", 0.1 * (1 + 0.01 * i)) for i in range(3)]
    res = cli("gate", "--baseline", base, *same, "-q", "--out", str(tmp_path / "g.json"))
    assert res.returncode == 0, res.stderr
    assert "gpudiag gate: PASS" in res.stdout
    res = cli(
        "gate",
        same[0],
        "--baseline",
        base,
        same[1],
        same[2],
        "--exit-zero",
        "--out",
        str(tmp_path / "g.json"),
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    "content,word",
    [
        ("not json", "not JSON"),
        ('{"format": "gpudiag-gate-baseline", "runs": 3}', "malformed"),
    ],
)
def test_malformed_baseline_exits_2(cli, tmp_path, content, word):
    base = tmp_path / "b.json"
    base.write_text(content)
    res = cli("gate", "--baseline", str(base), str(base))
    assert res.returncode == 2 and word in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "toml,word",
    [
        ("[gate\n", "not valid TOML"),
        ('[gate.metrics.steps_per_second]\nfail = "ten"\n', "a number or a percentage"),
        ('[gate.metrics.my_metric]\nfail = "10%"\n', "direction must be"),
        ('[gate.metrics.steps_per_second]\nlevel = "loud"\n', "level must be"),
    ],
)
def test_malformed_config_exits_2(cli, tmp_path, toml, word):
    cfg = tmp_path / "gate.toml"
    cfg.write_text(toml)
    base = report(tmp_path, "base.json", 0.1)
    res = cli("gate", "--baseline", base, "--config", str(cfg), base)
    assert res.returncode == 2 and word in res.stderr, res.stderr
