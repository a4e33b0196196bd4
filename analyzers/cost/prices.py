"""Reference GPU prices and sizes: what a GPU-hour costs and what each model can hold.

Figures are reference points for estimates, not quotes: each row says its date and basis.
A user's own price (`--price`, `[tool.gpudiag.prices]`, a prices file) always wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

AS_OF = "2026-11"


@dataclass(frozen=True)
class GpuModel:
    """One GPU model: how to recognise it, its memory, speed class and reference prices."""

    key: str
    label: str
    match: str  # regex on the NVML device name
    memory_gib: float
    relative_speed: float  # dense bf16 throughput class, H100 SXM = 1.0 (estimate)
    on_demand_usd: float  # per GPU-hour
    spot_usd: float  # per GPU-hour
    basis: str
    fp32_tflops: float | None = None  # dense FP32 (CUDA cores), datasheet
    tf32_tflops: float | None = None  # dense TF32 on tensor cores, datasheet; None: no TF32


H100_BASIS = (
    "public cost analysis: 8xH100 pod at $98.32/h on-demand and $19.66/h spot "
    "(= $12.29 and $2.46 per GPU-hour)"
)
A100_BASIS = "public cost analyses: 8xA100 cloud instance at roughly $30-40/h"
EST = "estimate relative to the H100 reference; set your own with --price"
# fp32_tflops / tf32_tflops: dense figures from NVIDIA's datasheets (sparse figures are 2x).

MODELS: tuple[GpuModel, ...] = (
    GpuModel("H200", "H200 141 GB", r"H200", 141, 1.1, 14.00, 2.80, EST, 67, 494.7),
    GpuModel(
        "H100-SXM",
        "H100 SXM 80 GB",
        r"H100.*(SXM|HBM3)|H100 80GB HBM3",
        80,
        1.0,
        12.29,
        2.46,
        H100_BASIS,
        67,
        494.7,
    ),
    GpuModel("H100-PCIe", "H100 PCIe 80 GB", r"H100", 80, 0.75, 10.00, 2.00, EST, 51, 378),
    GpuModel("A100-80", "A100 80 GB", r"A100.*80", 80, 0.32, 4.40, 1.30, A100_BASIS, 19.5, 156),
    GpuModel("A100-40", "A100 40 GB", r"A100", 40, 0.32, 3.75, 1.10, A100_BASIS, 19.5, 156),
    GpuModel("L40S", "L40S 48 GB", r"L40S", 48, 0.37, 1.90, 0.60, EST, 91.6, 183),
    GpuModel(
        "RTX6000Ada", "RTX 6000 Ada 48 GB", r"RTX 6000 Ada", 48, 0.37, 1.20, 0.50, EST, 91.1, 182.1
    ),
    GpuModel("A10G", "A10G 24 GB", r"A10G", 24, 0.07, 1.00, 0.35, EST, 31.2, 35),
    GpuModel("L4", "L4 24 GB", r"\bL4\b", 24, 0.12, 0.80, 0.25, EST, 30.3, 60),
    GpuModel("RTX4090", "RTX 4090 24 GB", r"4090", 24, 0.17, 0.70, 0.35, EST, 82.6, 82.6),
    GpuModel("T4", "T4 16 GB", r"\bT4\b", 16, 0.03, 0.53, 0.16, EST, 8.1, None),
)

SPOT_NOTE = (
    "spot/preemptible capacity typically costs 60-90% less, with 30 s to 2 min of "
    "termination notice; reserved capacity is 30-60% cheaper for 1-3 year commitments"
)


def identify(gpu_name: str) -> GpuModel | None:
    """The reference model whose pattern matches an NVML device name (first match)."""
    for m in MODELS:
        if re.search(m.match, gpu_name, re.IGNORECASE):
            return m
    return None


def by_key(key: str) -> GpuModel | None:
    """A model by its key (case-insensitive), e.g. 'H100-SXM' or 'L4'."""
    for m in MODELS:
        if m.key.lower() == key.lower():
            return m
    return None


@dataclass(frozen=True)
class Price:
    """The price a run's money figures use, and where it came from."""

    usd_per_gpu_hour: float
    source: str
    model: str | None = None

    def to_dict(self) -> dict:
        """JSON form used in reports."""
        return {
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "source": self.source,
            "model": self.model,
        }
