"""The GPU probe's counters: PCIe bytes and throttle time from NVML's cumulative field values
(exact deltas between ticks), and GPM metrics (SM, tensor, DRAM, PCIe activity; Hopper+).

`d` is the probe's per-device state (gpu.Device): handle, index, prev_fields, gpm_ok,
gpm_prev; these functions update it.
"""

from __future__ import annotations

import math
from typing import Any

from gpudiag.probes.gpu.nvml import Nvml

# Throttle (clock event) reasons, by bit, and the cumulative field value counting its time.
THROTTLE_REASONS = {
    "power_cap": (0x4, 74),  # SW power cap
    "hw_slowdown": (0x8, None),
    "sw_thermal": (0x20, 269),
    "hw_thermal": (0x40, 270),
    "power_brake": (0x80, 271),
}
FI_PCIE_TX, FI_PCIE_RX = 197, 198
GPM_METRICS = {
    "gpm_sm_active": 2,
    "gpm_sm_occupancy": 3,
    "gpm_tensor_active": 5,
    "gpm_dram_bw": 10,
    "gpm_pcie_tx_mib_s": 20,
    "gpm_pcie_rx_mib_s": 21,
}


def field_counters(n: Nvml, d: Any, t: int, v: dict[str, float | None]) -> None:
    """PCIe bytes and throttle time from cumulative field values (exact deltas)."""
    ids = [FI_PCIE_TX, FI_PCIE_RX] + [fi for _, fi in THROTTLE_REASONS.values() if fi]
    got = n.call(
        "nvmlDeviceGetFieldValues",
        d.handle,
        ids,
        device=d.index,
        what="nvmlDeviceGetFieldValues",
    )
    totals: dict[int, int] = {}
    for fv in got or []:
        if getattr(fv, "nvmlReturn", 0) == 0:
            totals[int(fv.fieldId)] = int(fv.value.ullVal)
    rates: dict[int, float] = {}
    for fid, total in totals.items():
        prev = d.prev_fields.get(fid)
        d.prev_fields[fid] = (t, total)
        if prev is not None and t > prev[0] and total >= prev[1]:
            rates[fid] = (total - prev[1]) / ((t - prev[0]) / 1e9)
    if FI_PCIE_TX in rates:
        v["pcie_tx_bytes_per_s"] = rates[FI_PCIE_TX]
        v["pcie_rx_bytes_per_s"] = rates.get(FI_PCIE_RX)
    elif FI_PCIE_TX not in totals:
        tx = n.call("nvmlDeviceGetPcieThroughput", d.handle, 0, device=d.index)
        rx = n.call("nvmlDeviceGetPcieThroughput", d.handle, 1, device=d.index)
        if tx is not None:  # KB/s over a 20 ms window: a point sample
            v["pcie_tx_bytes_per_s"] = tx * 1024.0
            v["pcie_rx_bytes_per_s"] = rx * 1024.0 if rx is not None else None
    reasons = n.call("nvmlDeviceGetCurrentClocksEventReasons", d.handle, device=d.index)
    if reasons is None:
        reasons = n.call("nvmlDeviceGetCurrentClocksThrottleReasons", d.handle, device=d.index)
    for name, (bit, rate_id) in THROTTLE_REASONS.items():
        if rate_id is not None and rate_id in rates:
            v[f"throttle_{name}"] = min(1.0, rates[rate_id] / 1e9)  # ns of throttle per s
        elif reasons is not None:
            v[f"throttle_{name}"] = 1.0 if int(reasons) & bit else 0.0


def gpm_metrics(n: Nvml, d: Any, v: dict[str, float | None]) -> None:
    """GPM metrics (Hopper+) between the previous sample and now (>= 100 ms apart)."""
    if not d.gpm_ok:
        return
    m = n.mod
    cur = n.call("nvmlGpmSampleAlloc", device=d.index)
    if cur is None or n.call("nvmlGpmSampleGet", d.handle, cur, device=d.index) is None:
        d.gpm_ok = False
        return
    mg = m.c_nvmlGpmMetricsGet_t()
    mg.version = getattr(m, "NVML_GPM_METRICS_GET_VERSION", 1)
    mg.numMetrics = len(GPM_METRICS)
    mg.sample1, mg.sample2 = d.gpm_prev, cur
    for k, mid in enumerate(GPM_METRICS.values()):
        mg.metrics[k].metricId = mid
    res = n.call("nvmlGpmMetricsGet", mg, device=d.index)
    n.call("nvmlGpmSampleFree", d.gpm_prev, device=d.index)
    d.gpm_prev = cur
    if res is None:
        return
    for k, name in enumerate(GPM_METRICS):
        met = res.metrics[k]
        if getattr(met, "nvmlReturn", 0) == 0:
            val = float(met.value)
            if not math.isfinite(val):  # seen on an H100: DRAM bandwidth NaN on the first pair
                continue
            v[name] = val / 100.0 if "mib_s" not in name else val
