"""The box at a glance for `gpudiag top` (shown by tui/top.py): GPUs, host, and processes
to attach to.

This side collects plain dicts (the TUI imports no psutil or NVML): every GPU with its
utilisation, memory, PCIe, clocks and throttle reasons, power and temperature; the host's CPU,
iowait, PSI and memory; the processes using GPUs and the Python processes one can attach to.
"""

from __future__ import annotations

import os
import time

import psutil

from gpudiag.probes.base import Target
from gpudiag.probes.gpu.probe import GpuProbe
from gpudiag.probes.host.probe import HostProbe


class BoxSampler:
    """Samples the whole box once a second for `gpudiag top`."""

    def __init__(self, gpu: GpuProbe | None = None) -> None:
        self.host = HostProbe()
        self.host.open(Target(os.getpid()))
        self.gpu = gpu or GpuProbe()
        self.gpu_status = self.gpu.open(Target(os.getpid()))
        self.gpu.watch_box()  # every device, not one job's
        self.history: dict[str, list[float]] = {}

    def snapshot(self) -> dict:
        """GPUs, host and processes now."""
        host = {}
        for s in self.host.sample():
            if not s.labels:
                host = dict(s.values)
        gpus = []
        gpu_procs: dict[int, list[str]] = {}
        if self.gpu_status.available:
            for s in self.gpu.sample():
                v = dict(s.values)
                key = s.labels["gpu"]
                hist = self.history.setdefault(key, [])
                if (util := v.get("util_gpu")) is not None:
                    hist.append(util)
                    del hist[:-60]
                gpus.append(
                    {"index": key, "name": s.labels.get("name"), **v, "history": list(hist)}
                )
            for pid, used in self.gpu.compute_processes().items():
                gpu_procs[pid] = [f"{index}:{mem / 2**30:.1f}GiB" for index, mem in used]
        rows = []
        me = os.getpid()
        for proc in psutil.process_iter(
            ["pid", "username", "name", "cmdline", "cpu_percent", "memory_info"]
        ):
            info = proc.info
            name = (info.get("name") or "").lower()
            cmd = " ".join(info.get("cmdline") or [])[:4096]  # cut after redaction, by top
            on_gpu = gpu_procs.get(info["pid"])
            if info["pid"] == me or not (on_gpu or name.startswith("python")):
                continue
            rows.append(
                {
                    "pid": info["pid"],
                    "user": info.get("username") or "?",
                    "command": cmd or name,
                    "gpus": ", ".join(on_gpu or []) or "-",
                    "cpu": info.get("cpu_percent") or 0.0,
                    "rss": getattr(info.get("memory_info"), "rss", 0) or 0,
                    "python": name.startswith("python"),
                }
            )
        rows.sort(key=lambda r: (r["gpus"] == "-", -r["cpu"]))
        return {
            "t": time.time(),
            "host": host,
            "gpus": gpus,
            "processes": rows,
            "gpu_status": self.gpu_status.to_dict(),
        }

    def close(self) -> None:
        """Release NVML."""
        self.gpu.close()
