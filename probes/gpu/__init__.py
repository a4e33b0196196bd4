"""The GPU probe and the one NVML layer."""
