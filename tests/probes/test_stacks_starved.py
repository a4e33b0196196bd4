"""Sampling starvation: a box too busy to give py-spy CPU on time. The probe says so in its
status, with the fix, and the verdict counts the samples at the share it recorded."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.probes.stacks.probe import StackProbe
from tests.analyzers.scenario import Scenario

NEAR = {"data_wait": 0.2, "forward": 0.4, "backward": 0.4}  # twice data_wait_warn


def test_an_unstarved_probe_has_no_status_to_add():
    probe = StackProbe()
    probe.ticks, probe.ticks_asked = 280.0, 300.0
    assert probe.final_status() is None


def _windows(asked_hz: float) -> Scenario:
    """5 windows of 3 s, each recording 60 loop samples where `asked_hz` asked for more."""
    sc = Scenario(cpu_count=2)
    for _ in range(5):
        sc.window(NEAR, ticks=60, asked_hz=asked_hz)
    return sc.host(0.5).process(1.0)


def test_a_starved_sampler_widens_the_verdict_instead_of_a_sure_one():
    """The same 300 loop samples: recorded on time (20 Hz asked) the verdict is sure; where
    100 Hz was asked they are a fifth of the ticks, bunched where py-spy got the CPU: counted
    at that share (60), the verdict is not sure and says why."""
    on_time = analyze(_windows(20).tl)
    assert on_time.metrics["stack_rate_achieved"] == 1.0
    assert on_time.verdict["sure"] and "fell behind" not in on_time.verdict["statement"]
    a = analyze(_windows(100).tl)
    assert a.metrics["stack_rate_achieved"] == pytest.approx(0.2)
    assert a.findings[0].id == on_time.findings[0].id == "DATA001"
    assert not a.verdict["sure"], a.verdict
    assert "stack sampling fell behind (it recorded 20% of the ticks" in a.verdict["statement"]
    assert "stack_rate_min=0.5" in a.verdict["statement"]
