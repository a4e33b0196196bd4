"""A scripted stand-in for pynvml: fake GPUs whose values change over time, per-call errors.

It exposes the same names gpudiag's NVML layer calls, so the GPU probe and analyzers are
tested without a GPU. `FakeNvml(gpus=[FakeGpu(...)])` behaves like an imported pynvml.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(
            {
                3: "Not Supported",
                6: "Not Found",
                9: "Driver Not Loaded",
                12: "NVML Shared Library Not Found",
                13: "Function Not Found",
                15: "GPU is lost",
            }.get(value, "Unknown Error")
        )
        self.value = value


Script = Callable[[float], float]


def const(v: float) -> Script:
    return lambda t: v


@dataclass
class FakeGpu:
    """One fake device. Rates are per second; cumulative counters integrate them."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total: int = 80 * 2**30
    util: Script = const(95)  # percent
    mem_util: Script = const(40)
    mem_used: Script = const(60 * 2**30)  # whole device
    job_mem: Script = const(60 * 2**30)  # the job's process
    job_sm: Script = const(95)  # percent, per-process
    pcie_rx: Script = const(2e9)  # bytes/s
    pcie_tx: Script = const(0.5e9)
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    sm_clock: Script = const(1980)
    sm_clock_max: int = 1980
    throttle: dict[str, Script] = field(default_factory=dict)  # reason -> share of time
    temperature: Script = const(60)
    power: Script = const(500)
    gpm: dict[int, Script] | None = None  # metric id -> percent, None = no GPM
    errors: dict[str, int] = field(default_factory=dict)  # function -> NVML error
    lost_after_s: float | None = None
    job_pids: list[int] = field(default_factory=list)
    other_pids: list[int] = field(default_factory=list)


FIELD_REASON = {74: "power_cap", 269: "sw_thermal", 270: "hw_thermal", 271: "power_brake"}
REASON_BIT = {
    "power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "power_brake": 0x80,
}


class FakeNvml:
    """Module-like fake of pynvml driven by a clock (seconds since start)."""

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN
    nvmlMemory_v2 = 0x02000028
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(
        self,
        gpus: list[FakeGpu],
        init_error: int | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self._t0 = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - self._t0)
        self.calls: dict[str, int] = {}
        self._totals: dict[tuple[int, str], tuple[float, float]] = {}

    # helpers
    def _g(self, h: int, fn: str) -> FakeGpu:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        g = self.gpus[h]
        if g.lost_after_s is not None and self.clock() >= g.lost_after_s:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in g.errors:
            raise NVMLError(g.errors[fn])
        return g

    def _cumulative(self, h: int, key: str, rate: float) -> int:
        t = self.clock()
        last_t, total = self._totals.get((h, key), (0.0, 0.0))
        total += rate * max(0.0, t - last_t)
        self._totals[(h, key)] = (t, total)
        return int(total)

    # the API
    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return self._g(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, h):
        return self._g(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        g = self._g(h, "nvmlDeviceGetMemoryInfo")
        used = g.mem_used(self.clock())
        return SimpleNamespace(total=g.memory_total, used=used, free=g.memory_total - used)

    def nvmlDeviceGetUtilizationRates(self, h):
        g = self._g(h, "nvmlDeviceGetUtilizationRates")
        t = self.clock()
        return SimpleNamespace(gpu=int(g.util(t)), memory=int(g.mem_util(t)))

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        g = self._g(h, "nvmlDeviceGetComputeRunningProcesses")
        t = self.clock()
        return [SimpleNamespace(pid=p, usedGpuMemory=int(g.job_mem(t))) for p in g.job_pids] + [
            SimpleNamespace(pid=p, usedGpuMemory=2**30) for p in g.other_pids
        ]

    def nvmlDeviceGetProcessUtilization(self, h, last_seen):
        g = self._g(h, "nvmlDeviceGetProcessUtilization")
        t = self.clock()
        if not g.job_pids:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        ts = int(t * 1e6) + 1
        return [
            SimpleNamespace(pid=p, timeStamp=ts, smUtil=int(g.job_sm(t)), memUtil=0)
            for p in g.job_pids
        ]

    def nvmlDeviceGetFieldValues(self, h, ids):
        g = self._g(h, "nvmlDeviceGetFieldValues")
        t = self.clock()
        out = []
        for fid in ids:
            if fid == 197:
                total = self._cumulative(h, "tx", g.pcie_tx(t))
            elif fid == 198:
                total = self._cumulative(h, "rx", g.pcie_rx(t))
            elif fid in FIELD_REASON:
                share = g.throttle.get(FIELD_REASON[fid], const(0))(t)
                total = self._cumulative(h, f"thr{fid}", share * 1e9)  # ns per second
            else:
                out.append(
                    SimpleNamespace(
                        fieldId=fid,
                        nvmlReturn=NVML_ERROR_NOT_SUPPORTED,
                        value=SimpleNamespace(ullVal=0),
                    )
                )
                continue
            out.append(
                SimpleNamespace(fieldId=fid, nvmlReturn=0, value=SimpleNamespace(ullVal=total))
            )
        return out

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        g = self._g(h, "nvmlDeviceGetPcieThroughput")
        t = self.clock()
        return int((g.pcie_tx(t) if counter == 0 else g.pcie_rx(t)) / 1024)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._g(h, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._g(h, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._g(h, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._g(h, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max

    def nvmlDeviceGetClockInfo(self, h, kind):
        g = self._g(h, "nvmlDeviceGetClockInfo")
        return int(g.sm_clock(self.clock())) if kind == 1 else 2619

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        g = self._g(h, "nvmlDeviceGetMaxClockInfo")
        return g.sm_clock_max if kind == 1 else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        g = self._g(h, "nvmlDeviceGetCurrentClocksEventReasons")
        t = self.clock()
        return sum(bit for r, bit in REASON_BIT.items() if g.throttle.get(r, const(0))(t) >= 0.5)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return int(self._g(h, "nvmlDeviceGetTemperature").temperature(self.clock()))

    def nvmlDeviceGetPowerUsage(self, h):
        return int(self._g(h, "nvmlDeviceGetPowerUsage").power(self.clock()) * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        self._g(h, "nvmlDeviceGetEnforcedPowerLimit")
        return 700_000

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        self._g(h, "nvmlDeviceGetTotalEccErrors")
        return 0

    def nvmlGpmQueryDeviceSupport(self, h):
        g = self._g(h, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(isSupportedDevice=1 if g.gpm else 0)

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(t=None)

    def nvmlGpmSampleFree(self, s):
        pass

    def nvmlGpmSampleGet(self, h, s):
        self._g(h, "nvmlGpmSampleGet")
        s.t, s.h = self.clock(), h
        return s

    class c_nvmlGpmMetricsGet_t:
        def __init__(self):
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(32)]

    def nvmlGpmMetricsGet(self, mg):
        g = self.gpus[mg.sample2.h]
        for k in range(mg.numMetrics):
            met = mg.metrics[k]
            script = (g.gpm or {}).get(met.metricId)
            if script is None:
                met.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            else:
                met.value = float(script(mg.sample2.t))
        return mg
