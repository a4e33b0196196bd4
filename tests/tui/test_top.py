"""`gpudiag top` on a box without a GPU: says so, lists Python processes, attaches with `a`."""

from __future__ import annotations

from gpudiag.tui.top import gpu_text

NO_GPU = {
    "gpu_status": {
        "name": "gpu",
        "available": False,
        "reason": "no NVIDIA driver: libnvidia-ml.so not found",
        "hint": "install the NVIDIA driver",
    },
    "host": {
        "cpu_util": 0.4,
        "cpu_count": 2.0,
        "cpu_iowait": 0.0,
        "mem_total_bytes": 24 * 2**30,
        "mem_available_bytes": 20 * 2**30,
    },
    "gpus": [],
}


def test_no_gpu_is_said_plainly():
    assert "No NVIDIA GPU" in str(gpu_text(NO_GPU))
