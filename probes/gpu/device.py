"""What the GPU probe reads of each NVML device: the values read every tick and once, and
the device as the probe remembers it between ticks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# (value, NVML function, argument): read every tick, and read once per device
TICK_QUERIES = (
    ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", None),
    ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", None),
    ("sm_clock_mhz", "nvmlDeviceGetClockInfo", 1),
    ("mem_clock_mhz", "nvmlDeviceGetClockInfo", 2),
    ("temperature_c", "nvmlDeviceGetTemperature", 0),
)
STATIC_QUERIES = (
    ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", None),
    ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", None),
    ("sm_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", 1),
    ("mem_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", 2),
)


@dataclass
class Device:
    """One NVML device and what the probe remembers between ticks."""

    index: int
    handle: Any
    uuid: str
    name: str
    memory_total: float | None
    prev_fields: dict[int, tuple[int, int]] = field(default_factory=dict)
    last_seen_us: int = 0
    gpm_prev: Any = None
    gpm_ok: bool = False
    lost: bool = False
    static: dict[str, float | None] | None = None  # link and clock maxima: read once


def text(value: Any) -> str | None:
    """An NVML string (bytes or str) as text; None stays None."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
