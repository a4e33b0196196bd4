"""End to end: the README renders as intended and its quick start works as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.docs.test_readme import ROOT, quick_start_command


@pytest.mark.slow
def test_quick_start_in_a_fresh_venv_prints_no_warning(tmp_path):
    """The README's first command, verbatim, in a copy of the repository."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, tmp_path / f)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not p.startswith(str(ROOT))
    )
    res = subprocess.run(
        ["bash", "-c", quick_start_command()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "Findings (" in res.stdout and "DATA001" in res.stdout, out[-4000:]
    # pip's notes about this machine's own index configuration are not the project's output
    lines = [
        ln for ln in out.splitlines() if not re.match(r"WARNING: Location '.*' is ignored", ln)
    ]
    warnings = [ln for ln in lines if re.search(r"\w*Warning: |^WARNING|^warning: ", ln)]
    assert not warnings, out[-4000:]
