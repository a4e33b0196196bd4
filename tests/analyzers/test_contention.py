"""HOST002 (other processes take the job's CPU) and the run-queue signal it rests on."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from tests.analyzers.scenario import Scenario
from tests.analyzers.test_findings import HEALTHY, ids, windows


def test_other_processes_taking_the_cpu_are_host002_naming_them():
    sc = (
        windows(Scenario(cpu_count=2), shares=HEALTHY)
        .host(0.98)
        .process(0.55, loop_rq=0.4)
        .others({("4242", "ffmpeg"): 0.9, ("4343", "python3"): 0.3})
    )
    a = analyze(sc.tl)
    assert ids(a) == ["HOST002"]
    f = a.findings[0]
    assert "ffmpeg (pid 4242)" in f.message
    ev = {e.metric: e for e in f.evidence}
    assert ev["loop_thread_runqueue_wait"].setting == "host_contention_warn"
    assert ev["other_processes_cpu"].value == pytest.approx(1.2, abs=0.01)
    assert f.speedup_basis.startswith("a bound")


def test_a_busy_box_without_run_queue_wait_is_not_host002():
    """Other processes use the other core, but the loop thread runs when it wants to."""
    sc = (
        windows(Scenario(cpu_count=2), shares=HEALTHY)
        .host(0.98)
        .process(0.95, loop_rq=0.02)
        .others({("4242", "ffmpeg"): 0.9})
    )
    assert ids(analyze(sc.tl)) == []


def test_run_queue_wait_from_the_job_itself_is_not_host002():
    """The job oversubscribes its own cores (its threads queue behind each other): no other
    process is there to name, so it is not HOST002."""
    sc = (
        windows(Scenario(cpu_count=2), shares=HEALTHY)
        .host(0.98)
        .process(0.55, loop_rq=0.4)
        .others({("4242", "sshd"): 0.1})
    )
    assert "HOST002" not in ids(analyze(sc.tl))


def test_workers_queued_for_a_cpu_compute_they_do_not_wait():
    """Workers whose CPU plus run-queue time fill their loading time are CPU-bound on a busy
    box: not loaders that wait, so no promise that more workers overlap anything."""
    shares = {"data_wait": 0.5, "forward": 0.2, "backward": 0.3}
    sc = (
        windows(Scenario(cpu_count=2), shares=shares, workers=2, worker_busy=0.95, worker_io=0.0)
        .host(0.99)
        .process(0.5, workers=2, worker_cpu=0.9, worker_rq=0.9)
    )
    a = analyze(sc.tl)
    f = next(f for f in a.findings if f.id in ("DATA001", "DATA002"))
    assert "overlap the loaders' waits" not in f.recommendation.summary.lower()
