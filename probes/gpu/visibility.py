"""Which GPUs a job can use, seen from outside it: its CUDA_VISIBLE_DEVICES, and whether it
holds an NVIDIA device open (it has a CUDA context)."""

from __future__ import annotations

import os

from gpudiag.probes.files import MAX_ENVIRON_BYTES, read_head


def has_nvidia_device_open(pids: set[int]) -> bool:
    """True when one of the processes holds /dev/nvidiaN open (it has a CUDA context)."""
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("/dev/nvidia") and link[11:].isdigit():
                return True
    return False


def visible_devices(pid: int) -> list[str] | None:
    """The job's CUDA_VISIBLE_DEVICES entries, or None when unset (all devices visible)."""
    try:
        env = read_head(f"/proc/{pid}/environ", MAX_ENVIRON_BYTES).split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            value = item.split(b"=", 1)[1].decode(errors="replace").strip()
            return [v.strip() for v in value.split(",") if v.strip()]
    return None
