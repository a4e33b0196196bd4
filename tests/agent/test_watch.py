"""`gpudiag watch`: job discovery, the shared budget, and two real jobs on the box."""

from __future__ import annotations

import re

import pytest

from gpudiag.agent.commands.watch import SharedCpu
from gpudiag.probes.base import Probe
from gpudiag.probes.host.discovery import ProcInfo, dcgm_process, find_jobs

BOX = [
    ProcInfo(1, 0, "systemd", ("/sbin/init",)),
    ProcInfo(100, 1, "python3", ("python3", "train.py")),  # torch
    ProcInfo(101, 100, "python3", ("python3", "train.py")),  # its DataLoader worker
    ProcInfo(200, 1, "python3", ("python3", "serve.py")),  # python without torch
    ProcInfo(300, 1, "tritonserver", ("tritonserver",)),  # on a GPU, not Python
    ProcInfo(400, 1, "python3", ("python3", "-m", "gpudiag.agent.cli.main", "watch")),  # gpudiag
    ProcInfo(401, 400, "py-spy", ("py-spy", "record")),
    ProcInfo(500, 1, "python3", ("python3", "other.py")),  # torch
]

TORCH = {100, 101, 400, 500}


def test_discovery_finds_job_roots_not_workers_nor_gpudiag():
    jobs = find_jobs(BOX, gpu_pids=[300, 101], torch_check=TORCH.__contains__, me=400)
    assert jobs == [100, 300, 500]


def test_discovery_does_not_read_known_jobs_and_their_workers_again():
    read = []

    def check(pid: int) -> bool:
        read.append(pid)
        return pid in TORCH

    jobs = find_jobs(BOX, [], check, me=400, known=[100])
    assert jobs == [100, 500] and 100 not in read and 101 not in read


def test_discovery_match_keeps_only_matching_commands():
    jobs = find_jobs(BOX, [], TORCH.__contains__, me=400, match=re.compile(r"other\.py"))
    assert jobs == [500]


def test_dcgm_is_found_by_process_name():
    assert dcgm_process(BOX) is None
    exporter = ProcInfo(9, 1, "dcgm-exporter", ("/usr/bin/dcgm-exporter", "-f", "x.csv"))
    assert dcgm_process([*BOX, exporter]) == exporter
    engine = ProcInfo(10, 1, "nv-hostengine", ("/usr/bin/nv-hostengine", "-n"))
    assert dcgm_process([engine]) == engine


def test_process_cpu_is_shared_evenly_between_jobs():
    cpu = [0.0]
    shared = SharedCpu(lambda: cpu[0])
    shared.set_jobs(1)
    cpu[0] = 2.0
    assert shared.per_job_s() == 2.0  # one job: all of it
    shared.set_jobs(4)
    cpu[0] = 6.0
    assert shared.per_job_s() == 3.0  # four jobs: a quarter of the next 4 s each


class _Adaptive(Probe):
    """A probe the governor turns: its level and py-spy goal."""

    name, adaptive = "stacks", True

    def __init__(self) -> None:
        self.level, self.cpu_goal = 1.0, None

    def set_level(self, level: float) -> None:
        self.level = level


def test_each_job_gets_its_share_of_the_budget_and_may_go_below_attach_floor():
    from gpudiag.agent.commands.watch import WATCH_MIN_LEVEL, SharedGovernor
    from gpudiag.agent.session.budget import MIN_LEVEL, SPY_SHARE, Budget

    probe = _Adaptive()
    gov = SharedGovernor(Budget(0.10, 400 << 20), [probe], shared=SharedCpu(lambda: 0.0))
    gov.rebudget(Budget(0.10 / 16, (400 << 20) // 16), 16)
    assert gov.budget.cpu_cores == pytest.approx(0.00625) and gov.jobs == 16
    assert probe.cpu_goal == pytest.approx(0.00625 * gov.target_share * SPY_SHARE)
    gov.set_level(0.0001)
    assert probe.level == WATCH_MIN_LEVEL < MIN_LEVEL


def test_recent_findings_follow_a_job_that_changed():
    import os

    from gpudiag.agent.base.config import Settings
    from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
    from gpudiag.analyzers.model.thresholds import Thresholds
    from gpudiag.probes.base import Target
    from tests.analyzers.scenario import Scenario
    from tests.analyzers.test_findings import HEALTHY

    starved = {"data_wait": 0.6, "forward": 0.15, "backward": 0.2, "optimizer": 0.05}
    sc = Scenario(cpu_count=8)
    for _ in range(40):  # two minutes starved, then fixed for two minutes
        sc.window(shares=starved)
    for _ in range(40):
        sc.window(shares=HEALTHY)
    sc.host(0.15).process(0.9)
    opts = SessionOptions(cpu_budget=None, progress=False)
    session = Session(
        Target(os.getpid()), Settings(Thresholds(), (), None), opts, SessionParts(probes=[])
    )
    session.timeline = sc.tl
    whole = [f.id for f in session.snapshot().findings]
    recent = [f.id for f in session.snapshot(recent_s=60).findings]
    assert "DATA001" in whole and "DATA001" not in recent
