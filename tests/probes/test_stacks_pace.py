"""The stack probe's pacing below its lowest rates (issue 53 N65, watch beside 1,500 idle
threads): py-spy reads every thread at every tick, so such a job cost watch about 0.15 cores
at the lowest rate (1 Hz) against a share of 0.0125. Each window's measured py-spy CPU now
decides a rest after it, so that windows and rests together cost the probe's goal; past the
longest rest, stack sampling stops until the job's threads fall to what the goal affords."""

from __future__ import annotations

import pytest

from gpudiag.probes.base import ProbeStatus
from gpudiag.probes.stacks.pace import MAX_REST_S, Pace
from gpudiag.probes.stacks.probe import StackConfig, StackProbe
from gpudiag.probes.stacks.pyspy import SpyRun

GOAL = 0.10 / 8 * 0.7 * 0.7  # py-spy's goal for one of 8 jobs at watch's default budget


def test_a_window_over_the_goal_at_the_lowest_rates_is_followed_by_a_rest_that_pays_for_it():
    pace = Pace()
    line = pace.after_window(1.2, 10.0, 1500, GOAL, lowest=True)
    assert pace.paced and not pace.stopped
    # the window's 1.2 CPU s over window and rest: the goal, by construction
    assert 1.2 / (10.0 + pace.rest_s) == pytest.approx(GOAL)
    assert pace.duty() == pytest.approx(10.0 / (10.0 + pace.rest_s))
    assert line is not None and "stack sampling paced" in line
    assert "1500 threads per tick" in line and "1.20 CPU s over 10 s" in line
    assert f"one window every {10.0 + pace.rest_s:.0f} s" in line
    assert pace.after_window(1.2, 10.0, 1500, GOAL, lowest=True) is None  # said once


def test_above_the_lowest_rates_or_within_the_goal_there_is_no_rest():
    pace = Pace()
    assert pace.after_window(1.2, 10.0, 1500, GOAL, lowest=False) is None
    assert not pace.paced and pace.duty() == 1.0  # the governor lowers the rates first
    assert pace.after_window(0.01, 10.0, 4, GOAL, lowest=True) is None
    assert not pace.paced
    assert pace.after_window(1.2, 10.0, 1500, None, lowest=True) is None  # no budget
    assert not pace.paced


def test_a_job_that_got_cheaper_goes_back_to_its_rates_and_says_so():
    pace = Pace()
    pace.after_window(1.2, 10.0, 1500, GOAL, lowest=True)
    pace.rested(pace.rest_s)
    line = pace.after_window(0.02, 10.0, 20, GOAL, lowest=True)
    assert not pace.paced and line is not None and "back to its rates" in line
    assert 0.0 < pace.share() < 1.0  # the time rested still counts in the share sampled


def test_past_the_longest_rest_stack_sampling_stops_until_the_threads_fit():
    pace = Pace()
    cost = GOAL * (10.0 + MAX_REST_S) * 3  # three times what one window per 300 s buys
    line = pace.after_window(cost, 10.0, 3000, GOAL, lowest=True)
    assert pace.stopped and pace.paced and pace.duty() == 0.0
    affordable = pace.affordable_threads()
    assert affordable == pytest.approx(1000, abs=1)
    assert line is not None and "stack sampling stopped" in line
    assert f"at most {affordable} threads" in line and "longer than 300 s" in line
    assert not pace.may_resume(2000, GOAL) and pace.stopped
    assert pace.may_resume(3000, GOAL * 4)  # its share grew: fewer jobs share the budget
    assert not pace.stopped
    pace.after_window(cost, 10.0, 3000, GOAL, lowest=True)
    assert pace.stopped and pace.may_resume(900, GOAL) and not pace.stopped


class _Burnt(StackProbe):
    """A stack probe whose windows are fakes: each cost what the test says, on a process
    whose thread count the test says."""

    threads = 1500

    def __init__(self) -> None:
        super().__init__(StackConfig(rate_hz=100, min_rate_hz=1, pace=True))
        self._stop.set()  # every rest and every wait returns at once: no clock in the test


def _window(probe: StackProbe, cpu_s: float, monkeypatch) -> None:
    monkeypatch.setattr("gpudiag.probes.stacks.probe.thread_count", lambda pid: _Burnt.threads)
    runs = [
        SpyRun("all", 1, 1, "x", cpu_s=cpu_s * 0.6),
        SpyRun("gil", 1, 2, "y", cpu_s=cpu_s * 0.4),
    ]
    probe._pace_after(runs, 10.0)


def test_the_probe_paced_by_its_goal_says_so_in_the_log_its_status_and_its_rates(monkeypatch):
    from gpudiag.probes.base import Target

    probe = _Burnt()
    probe.target, probe.cpu_goal = Target(1), GOAL
    probe.set_level(0.01)  # watch's floor: 1 Hz
    assert probe.at_lowest() and probe.live_status() is None
    _window(probe, 1.2, monkeypatch)
    assert probe.paced()
    (note,) = probe.notes()
    assert "stack sampling paced" in note and probe.notes() == []
    status = probe.live_status()
    assert isinstance(status, ProbeStatus) and status.available and "paced" in (status.reason or "")
    assert "--cpu-budget" in (status.hint or "")
    rates = probe.rates()
    assert 0.0 < rates["stacks_sampled_ratio"] < 0.1 and rates["stacks_threads"] == 1500.0
    assert probe.final_status() == status

    _window(probe, 100.0, monkeypatch)  # a window that would need an hour's rest: stopped
    assert "stack sampling stopped" in probe.notes()[0]
    stopped = probe.live_status()
    assert (
        stopped is not None and not stopped.available and "resumes when" in (stopped.reason or "")
    )
    assert probe.rates()["stacks_sampled_ratio"] == 0.0


def test_attach_never_paces():
    probe = StackProbe(StackConfig())
    assert probe.pace is None and not probe.paced() and "stacks_sampled_ratio" not in probe.rates()
