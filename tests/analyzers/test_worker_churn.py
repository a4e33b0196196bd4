"""DATA003 (DataLoader workers re-created every epoch) over scripted timelines, and the jobs that
are not it (persistent workers, no wait)."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.probes.base import Sample
from tests.analyzers.scenario import Scenario
from tests.analyzers.test_evaluation import steps
from tests.analyzers.test_findings import ids, windows


def churning(starts: float, exits: float, wait: float = 0.7) -> Scenario:
    shares = {"data_wait": wait, "forward": (1 - wait) * 0.4, "backward": (1 - wait) * 0.6}
    sc = windows(Scenario(), shares=shares).host(0.5).process(0.4, workers=2, worker_cpu=0.8)
    for i, t in enumerate(sc._times(15, 1_000_000_000)):
        sc.tl.add(
            Sample(
                "process",
                t,
                {"scope": "workers"},
                {
                    "procs": 2.0,
                    "worker_starts": starts if i % 3 == 0 else 0.0,
                    "worker_exits": exits if i % 3 == 0 else 0.0,
                },
            )
        )
    return sc


def test_workers_recreated_every_epoch_is_data003_not_data001():
    a = analyze(churning(2, 2).tl)
    assert ids(a)[0] == "DATA003" and "DATA001" not in ids(a)
    f = a.findings[0]
    ev = {e.metric: e for e in f.evidence}
    # 10 started and ended, 2 at a time: 5 generations (4 inside the loop's window)
    assert 4.0 <= ev["worker_generations_recreated"].value <= 5.0
    assert ev["worker_generations_recreated"].setting == "worker_respawn_min"
    assert ev["data_wait_at_epoch_start_share"].setting == "data_wait_warn"
    assert f.fix == {"kind": "dataloader", "values": {"persistent_workers": True}}
    assert "persistent_workers=True" in f.recommendation.summary


def test_the_wait_at_epoch_starts_comes_from_the_long_steps():
    """Hooks: 5 epochs of 30 steps, each first step 1.5 s longer: the start's wait is that."""
    sc = churning(2, 2)
    steps(sc, ([1.6] + [0.1] * 29) * 5, ([1.55] + [0.02] * 29) * 5)
    f = next(f for f in analyze(sc.tl).findings if f.id == "DATA003")
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["seconds_lost_per_epoch_start"] == pytest.approx(1.5, rel=0.05)
    assert f.impact == pytest.approx(7.5 / 22.5, rel=0.05)  # not the whole wait (47%)


def test_persistent_workers_or_no_wait_is_not_data003():
    a = analyze(churning(0, 0).tl)
    assert "DATA003" not in ids(a) and "DATA001" in ids(a)  # no churn: the loaders' DATA001
    assert "DATA003" not in ids(analyze(churning(2, 2, wait=0.03).tl))  # churn, no wait
