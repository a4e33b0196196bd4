"""End to end: deploy/: the alert rules, the Grafana dashboard, the DaemonSet and the systemd unit
are valid, and every query in them uses metrics gpudiag exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.deploy.test_deploy import DASHBOARD, DEPLOY, RULES


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def test_promtool_checks_the_rules_and_their_unit_test():
    promtool = _promtool()
    res = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    test = RULES.with_name("gpudiag-alerts.test.yaml")
    res = subprocess.run(
        [promtool, "test", "rules", test.name], capture_output=True, text=True, cwd=test.parent
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_parses_every_dashboard_query(tmp_path):
    promtool = _promtool()
    dash = json.loads(DASHBOARD.read_text())
    rules = [
        {
            "record": f"gpudiag:dashboard_{i}",
            "expr": t["expr"].replace("$Hostname", ".*").replace("$job", ".*"),
        }
        for i, t in enumerate(t for p in dash["panels"] for t in p["targets"])
    ]
    f = tmp_path / "dash.rules.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_systemd_unit_verifies(tmp_path):
    unit = (DEPLOY / "systemd" / "gpudiag-watch.service").read_text()
    exec_start = re.search(r"^ExecStart=/usr/local/bin/gpudiag (.*)$", unit, re.M).group(1)
    from gpudiag.agent.cli.parser import build_parser

    assert build_parser().parse_args(exec_start.split()).metrics_addr == "127.0.0.1"
    analyze, gpudiag = shutil.which("systemd-analyze"), shutil.which("gpudiag")
    if analyze is None or gpudiag is None:
        pytest.skip("systemd-analyze not installed")
    f = tmp_path / "gpudiag-watch.service"
    f.write_text(unit.replace("/usr/local/bin/gpudiag", gpudiag))
    res = subprocess.run([analyze, "verify", str(f)], capture_output=True, text=True)
    assert res.returncode == 0 and "gpudiag-watch.service" not in res.stderr, res.stderr
