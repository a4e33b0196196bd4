"""Shared fixtures: paths to the workloads and a helper to run the gpudiag CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).parent / "workloads"


def gpudiag(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would, capturing its output."""
    return subprocess.run([sys.executable, "-m", "gpudiag.agent.cli", *args],
                          capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture
def run_cli():
    return gpudiag
