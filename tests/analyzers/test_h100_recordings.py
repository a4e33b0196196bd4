"""Real H100 recordings (gpudiag run --record) with a measured answer for each.

Each job was also run bare before and after applying the fix, so the right top finding and
the speed-up of its fix are known (see tests/fixtures/h100/README.md). Replaying a recording
must name that cause, stay silent on the healthy and fixed jobs, and predict the measured
speed-up within 25%.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudiag.agent.output.recording import read_recording
from gpudiag.analyzers import analyze
from gpudiag.analyzers.timeline.timeline import Timeline

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "h100"

# recording: (right top warning/error finding or None, measured speed-ups of its fix)
TRUTH = {
    "healthy": (None, ()),
    "starved": ("DATA001", (7.5, 7.6)),
    "starved_fixed": ("DATA002", ()),  # 16 workers gave x1.10: loaders fill the cores
    "pageable": ("XFER001", (6.6, 6.3)),
    "pageable_fixed": (None, ()),  # the link near saturation is the truth: a note
    "launch": ("HOST001", (1.9, 2.0)),
    "launch_fixed": ("HOST001", ()),
    "fp32": ("GPU003", (5.4, 5.4)),
    "fp32_fixed": (None, ()),
    "ckpt": ("CKPT001", (24.0, 18.5)),
    "ckpt_fixed": (None, ()),
}


def replay(name: str):
    _rec, samples = read_recording(str(FIXTURES / f"{name}.jsonl.gz"))
    tl = Timeline()
    tl.extend(samples)
    return analyze(tl)


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_replay_names_the_measured_cause_and_its_speedup(name):
    expected, measured = TRUTH[name]
    a = replay(name)
    serious = [f for f in a.findings if f.severity in ("error", "warning")]
    if expected is None:
        assert serious == [], [(f.id, f.severity, f.impact) for f in serious]
        return
    assert serious and serious[0].id == expected, [(f.id, f.impact) for f in serious]
    top = serious[0]
    assert top.speedup_basis, "every prediction says how it was made"
    for m in measured:
        assert abs(top.expected_speedup / m - 1) <= 0.25, (top.expected_speedup, m)
    if a.cost.get("if_fixed"):
        assert a.cost["if_fixed"]["expected_speedup"] == pytest.approx(
            top.expected_speedup, rel=1e-3
        )


def test_the_loop_window_leaves_start_up_out():
    """The healthy job idles through imports and CUDA init, then runs the GPU at 100%."""
    a = replay("healthy")
    assert a.metrics["gpu0_busy"] > 0.95
    assert a.phases["source"].startswith("in-process hooks")
    assert a.phases["startup_s"] > 5


def test_launch_bound_names_the_per_parameter_optimizer_and_its_fix():
    f = next(f for f in replay("launch").findings if f.id == "HOST001")
    assert "foreach=False" in f.message or "per-parameter" in f.message
    assert "fused=True" in f.recommendation.actions[0]
    fixed = next(f for f in replay("launch_fixed").findings if f.id == "HOST001")
    assert "reduce-overhead" in " ".join(fixed.recommendation.actions)
    assert fixed.speedup_basis.startswith("a bound")


def test_power_cap_at_the_default_limit_is_not_a_warning():
    for name in ("healthy", "fp32_fixed", "ckpt_fixed"):
        th = [f for f in replay(name).findings if f.id == "THROT001"]
        assert all(f.severity == "note" for f in th)


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_every_finding_says_how_its_speedup_was_made(name):
    """The README promises a basis for every finding's expected speed-up, notes included."""
    for f in replay(name).findings:
        assert f.speedup_basis, f.id
