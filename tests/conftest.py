"""Shared fixtures: paths to the workloads and a helper to run the gpudiag CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).parent / "workloads"


def gpudiag(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "gpudiag.agent.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


@pytest.fixture
def run_cli():
    return gpudiag


def _nvml_has_gpu() -> bool:
    import os

    from gpudiag.probes.base import Target
    from gpudiag.probes.gpu import GpuProbe

    probe = GpuProbe()
    ok = probe.open(Target(os.getpid())).available
    probe.close()
    return ok


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run only where NVML finds a GPU."""
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if gpu_items and not _nvml_has_gpu():
        skip = pytest.mark.skip(reason="no NVIDIA GPU found by NVML")
        for item in gpu_items:
            item.add_marker(skip)
