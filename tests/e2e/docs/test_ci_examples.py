"""End to end: the CI gate examples in docs/ci-gate.md: installable without PyPI, and exit 3
(inconclusive) is a warning in GitHub Actions as in GitLab CI (issue 26, item 6)."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from tests.docs.test_ci_examples import _yaml_blocks


def _github_gate_script() -> str:
    wf = next(b for b in _yaml_blocks() if "jobs" in b)
    steps = wf["jobs"]["gate"]["steps"]
    return next(s["run"] for s in steps if "run" in s and "gpudiag gate" in s["run"])


@pytest.mark.parametrize("gate_rc,step_rc", [(0, 0), (1, 1), (2, 2), (3, 0)])
def test_github_gate_step_warns_on_inconclusive_and_fails_on_regression(tmp_path, gate_rc, step_rc):
    fake = tmp_path / "gpudiag"
    fake.write_text(f"#!/bin/sh\nexit {gate_rc}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    # GitHub runs `run:` scripts with `bash -e {0}`
    res = subprocess.run(
        ["bash", "-e", "-c", _github_gate_script()], env=env, capture_output=True, text=True
    )
    assert res.returncode == step_rc, res.stdout + res.stderr
    if gate_rc == 3:
        assert "::warning::" in res.stdout
