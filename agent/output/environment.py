"""What the run happened on: host, CPUs, Python, torch, GPUs."""

from __future__ import annotations

import os
import platform
import socket
from importlib import metadata

import psutil

from gpudiag.probes.files import MAX_MAPS_BYTES, read_head
from gpudiag.probes.host.probe import cpu_count


def _target_torch_version(pid: int | None) -> str | None:
    """torch's version as the target sees it: from its interpreter's site-packages, else ours."""
    if pid is not None:
        try:
            maps = read_head(f"/proc/{pid}/maps", MAX_MAPS_BYTES).decode(errors="replace")
        except OSError:
            maps = ""
        for line in maps.splitlines():
            if "/torch/lib/libtorch" in line:
                root = line.split()[-1].split("/torch/lib/")[0]
                try:
                    for entry in os.listdir(root):
                        if entry.startswith("torch-") and entry.endswith(".dist-info"):
                            return entry[len("torch-") : -len(".dist-info")]
                except OSError:
                    break
                break
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def describe_environment(pid: int | None = None, hardware: dict | None = None) -> dict:
    """A fingerprint of the machine and software, as stored in every report.

    `hardware` (driver, GPUs) comes from the GPU probe when it ran.
    """
    env = {
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu_count": cpu_count(),
        "cpu_physical": psutil.cpu_count(logical=False),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "torch": _target_torch_version(pid),
        "driver": None,
        "gpus": [],
    }
    env.update(hardware or {})
    return env


def _cpu_model() -> str | None:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None
