"""The one NVML layer: lazy init, and every call through `Nvml.call`.

* NotSupported / FunctionNotFound (and a missing binding in an old nvidia-ml-py) mean "not
  available": remembered per call and device, reported once, never retried.
* GpuIsLost / Unknown / DriverNotLoaded (a driver reload mid-run) mark the device lost:
  `GpuLost` is raised, the caller records it and carries on with the other devices.
* A missing library or driver gives a ProbeStatus that says why and how to fix it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from gpudiag.probes.base import ProbeStatus

DRIVER_HINT = "install the NVIDIA driver (it provides libnvidia-ml.so) and check `nvidia-smi`"


class GpuLost(Exception):
    """A device stopped answering (NVML GpuIsLost / Unknown)."""

    def __init__(self, device: int, message: str) -> None:
        super().__init__(message)
        self.device = device


class NvmlNotFound(Exception):
    """NVML's NotFound: for per-process utilisation it means no sample in the window."""


class Nvml:
    """Wraps a pynvml-like module (the real `pynvml`, or a fake in tests)."""

    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._mod: Any = module  # pynvml or a fake: its functions are looked up by name
        self.ready = False
        self.unsupported: dict[str, str] = {}
        self.lost: dict[int, str] = {}

    @property
    def mod(self) -> Any:
        """The underlying pynvml module."""
        return self._mod

    def init(self, name: str = "gpu") -> ProbeStatus:
        """Load and initialise NVML; never raises."""
        if self._mod is None:
            try:
                import pynvml
            except ImportError:
                return ProbeStatus(
                    name,
                    False,
                    "nvidia-ml-py (pynvml) is not installed",
                    "pip install nvidia-ml-py",
                )
            self._mod = pynvml
        m = self._mod
        try:
            m.nvmlInit()
        except m.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == getattr(m, "NVML_ERROR_LIBRARY_NOT_FOUND", -1):
                return ProbeStatus(
                    name, False, "no NVIDIA driver: libnvidia-ml.so not found", DRIVER_HINT
                )
            if code == getattr(m, "NVML_ERROR_DRIVER_NOT_LOADED", -1):
                return ProbeStatus(
                    name,
                    False,
                    "NVIDIA driver is installed but not loaded",
                    "load the kernel module (`sudo modprobe nvidia`) or reboot",
                )
            if code == getattr(m, "NVML_ERROR_NO_PERMISSION", -1):
                return ProbeStatus(
                    name,
                    False,
                    "no permission to use NVML",
                    "run as a user with access to /dev/nvidia*",
                )
            return ProbeStatus(name, False, f"NVML failed to start: {exc}", DRIVER_HINT)
        except OSError as exc:
            return ProbeStatus(name, False, f"cannot load NVML: {exc}", DRIVER_HINT)
        self.ready = True
        try:
            count = m.nvmlDeviceGetCount()
        except m.NVMLError as exc:
            return ProbeStatus(name, False, f"NVML cannot count devices: {exc}", DRIVER_HINT)
        if count == 0:
            return ProbeStatus(
                name,
                False,
                "the NVIDIA driver is loaded but sees no GPU",
                "check `nvidia-smi`; in a container pass the GPUs (--gpus all)",
            )
        return ProbeStatus(name, True)

    def call(self, fn: str, *args: Any, device: int = -1, what: str | None = None) -> Any:
        """Call pynvml.<fn>(*args): None when not available here, GpuLost when the GPU is gone.

        NVML's NotFound raises NvmlNotFound (callers decide what it means).
        """
        key = f"{what or fn}@{device}"
        if key in self.unsupported:
            return None
        if device in self.lost:
            raise GpuLost(device, self.lost[device])
        m = self._mod
        func = getattr(m, fn, None)
        if func is None:
            self.unsupported[key] = "not in this nvidia-ml-py"
            return None
        try:
            return func(*args)
        except m.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (
                getattr(m, "NVML_ERROR_NOT_SUPPORTED", -1),
                getattr(m, "NVML_ERROR_FUNCTION_NOT_FOUND", -1),
                getattr(m, "NVML_ERROR_NO_PERMISSION", -1),
            ):
                self.unsupported[key] = str(exc) or "not supported"
                return None
            if code == getattr(m, "NVML_ERROR_NOT_FOUND", -1):
                raise NvmlNotFound(str(exc)) from None
            if code in (
                getattr(m, "NVML_ERROR_GPU_IS_LOST", -1),
                getattr(m, "NVML_ERROR_UNKNOWN", -1),
                getattr(m, "NVML_ERROR_DRIVER_NOT_LOADED", -1),  # driver unloaded mid-run
                getattr(m, "NVML_ERROR_UNINITIALIZED", -1),
            ):
                self.lost[device] = f"{fn}: {exc}"
                raise GpuLost(device, self.lost[device]) from None
            self.unsupported[key] = f"failed: {exc}"
            return None

    def shutdown(self) -> None:
        """Release NVML."""
        if self.ready:
            try:
                self._mod.nvmlShutdown()
            except Exception:
                pass
            self.ready = False
