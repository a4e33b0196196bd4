"""Exact throughput metrics and SYNC001 from scripted hook samples."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.timeline import Timeline
from gpudiag.probes.base import Sample
from gpudiag.probes.inprocess import parse_message


def hook_timeline(n: int = 200, dt: float = 0.1, dw: float = 0.02, syncs: int = 0,
                  sync_t: float = 0.0) -> Timeline:
    tl = Timeline()
    rows = [[1000.0, None, 0, 0, 0, 0, 0, 0, 0]]
    for i in range(1, n):
        step = dt * (2.0 if i % 10 == 0 else 1.0)  # one slow step in 10
        rows.append([1000.0 + i * dt, step, dw, 32, 0.0, 0, 0, syncs, sync_t])
    sites = {"/work/train.py:88:train:item": 40} if syncs else {}
    tl.extend(parse_message({"steps": rows, "sites": sites}))
    return tl


def test_throughput_metrics_from_hooks():
    m = analyze(hook_timeline()).metrics
    assert m["steps"] == 200
    total = 0.1 * (199 + 19)  # 19 steps of 0.2 s among 199
    assert m["steps_per_second"] == pytest.approx(199 / total)
    assert m["samples_per_second"] == pytest.approx(199 * 32 / total)
    assert m["step_time_p50_s"] == pytest.approx(0.1, rel=0.02)
    assert m["step_time_p95_s"] == pytest.approx(0.2, rel=0.02)
    assert m["step_time_max_s"] == pytest.approx(0.2)
    assert m["data_wait_ratio"] == pytest.approx(199 * 0.02 / total)


def test_sync001_names_the_call_site():
    a = analyze(hook_timeline(syncs=3, sync_t=0.03))
    f = next(f for f in a.findings if f.id == "SYNC001")
    assert str(f.location) == "/work/train.py:88:train"
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["syncs_per_step"] == 3
    assert f.impact == pytest.approx(199 * 0.03 / (0.1 * 218), rel=0.01)


def test_few_syncs_are_not_a_finding():
    a = analyze(hook_timeline(syncs=1, sync_t=0.001))
    assert "SYNC001" not in [f.id for f in a.findings]


def test_no_hooks_no_throughput_metrics():
    tl = Timeline()
    tl.add(Sample("host", 1, {}, {"cpu_util": 0.5}))
    assert "steps" not in analyze(tl).metrics
