"""Against real NVML: runs only where a GPU exists (marked gpu)."""

from __future__ import annotations

import os
import time

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.gpu.probe import GpuProbe


@pytest.mark.gpu
def test_real_gpu_samples_match_the_declared_fields():
    probe = GpuProbe()
    assert probe.open(Target(os.getpid())).available
    probe.sample()
    time.sleep(1.0)
    samples = probe.sample()
    declared = {f.name for f in probe.fields}
    assert samples
    for s in samples:
        assert set(s.values) <= declared
        assert 0.0 <= s.values["util_gpu"] <= 1.0
        assert s.values["mem_total_bytes"] > 0
    assert probe.describe()["driver"]
    probe.close()
