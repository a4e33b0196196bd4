"""The README's quick start, as a new user runs it: a fresh virtual environment, the install
commands, `gpudiag demo` beside a process burning a core; the demo must name its planted
cause (issue 26). Slow (it installs torch into the new environment): `pytest -m slow`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_readme_quick_start_in_a_fresh_venv_on_a_busy_box(tmp_path):
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e '.[demo]'" in readme and "gpudiag demo" in readme
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    # The README takes torch's CPU build from PyTorch's CPU index; this project's machines
    # reach only their configured index, whose torch==2.13.0 is that same CPU build.
    subprocess.run([*pip, "torch==2.13.0"], check=True, timeout=1200)
    subprocess.run([*pip, "-e", f"{ROOT}[demo]"], check=True, timeout=600, cwd=tmp_path)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        res = subprocess.run(
            [str(venv / "bin" / "gpudiag"), "demo", "--out", str(tmp_path / "demo.json")],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
    finally:
        burner.kill()
        burner.wait()
    assert res.returncode == 0, res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    assert re.match(r"^Found: loader-bound: DATA001 ", last), res.stdout[-3000:]
