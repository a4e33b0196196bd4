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


class _Clock:
    """A fake clock and a fake CPU counter: watch's CPU grows only when a test spends it."""

    def __init__(self) -> None:
        self.t, self.cpu = 1000.0, 50.0

    def now(self) -> float:
        return self.t

    def cpu_s(self) -> float:
        return self.cpu


def _budgeted_watcher(pids: list[int], clock: _Clock, start_cost_s: float, **kw):
    """A watcher whose session starts are fakes that each cost `start_cost_s` CPU seconds,
    and whose stops cost as much again, measured on the fake counter."""
    import threading

    from gpudiag.agent.base.config import Settings
    from gpudiag.agent.commands.watch import Watched, Watcher
    from gpudiag.agent.session.budget import CpuAllowance
    from gpudiag.agent.session.session import SessionOptions
    from gpudiag.analyzers.model.thresholds import Thresholds

    class FakeSession:
        governor = None

        def __init__(self) -> None:
            self.stopped = threading.Event()

        def stop(self) -> None:
            clock.cpu += start_cost_s
            self.stopped.set()

    class Fake(Watcher):
        def _start(self, pid, jobs=1, ranks=None):
            clock.cpu += start_cost_s  # py-spy's dump, the probes' opening...
            s = FakeSession()
            th = threading.Thread(target=s.stopped.wait, daemon=True)
            th.start()
            self.jobs[pid] = Watched(s, None, th)  # type: ignore[arg-type]

    log: list[str] = []
    w = Fake(
        Settings(Thresholds(), (), None),
        SessionOptions(),
        cpu_budget=0.10,
        discover=lambda: list(pids),
        log=log.append,
        allowance=CpuAllowance(0.10, clock.cpu_s, clock=clock.now, hold_s=30.0),
        **kw,
    )
    return w, log


def _no_such_pids(n: int) -> list[int]:
    """Pids past the kernel's pid_max: no process has them."""
    top = int(open("/proc/sys/kernel/pid_max").read())
    return [top + 1000 + i for i in range(n)]


def test_session_starts_are_paid_from_the_cpu_budget_and_wait_when_it_is_spent():
    """Issue 53: starting a session (py-spy, /proc) cost CPU no budget counted, so many new
    idle 'jobs' kept watch over its budget. Starts are measured and paid from the budget
    (0.10 cores, holding 30 s of it: 3 CPU s); when it is spent the rest wait, said with
    units, and start as the budget refills."""
    clock = _Clock()
    pids = _no_such_pids(6)
    w, log = _budgeted_watcher(pids, clock, start_cost_s=1.0)
    try:
        w.poll()
        assert sorted(w.jobs) == pids[:3]  # 3 CPU s held, 1 CPU s a start
        assert w.deferred == set(pids[3:]) and w.health()["jobs_deferred"][0] == 3
        line = next(m for m in log if "deferred" in m)
        assert "cores" in line and "CPU s" in line and str(pids[3]) in line, line
        assert w.health()["watch_session_start_cpu_seconds"][0] == 3.0
        clock.t += 5.0  # 0.5 CPU s more budget: less than a start costs
        w.poll()
        assert len(w.jobs) == 3
        clock.t += 5.0  # 1 CPU s
        w.poll()
        assert len(w.jobs) == 4 and w.deferred == set(pids[4:])
        clock.t += 3600.0  # a quiet hour buys 30 s of budget, not an hour's: 3 starts
        w.poll()
        assert sorted(w.jobs) == pids and not w.deferred
        assert w.health()["jobs_deferred"][0] == 0
    finally:
        w.close()


def test_a_spent_budget_stops_no_watched_job_for_a_newcomer():
    """With the budget spent, an idle watched job is not dropped for a new one (a stop and a
    start both cost CPU, and the dropped job's data would be lost): the newcomer waits."""
    clock = _Clock()
    old, new = _no_such_pids(2)
    pids = [old]
    w, log = _budgeted_watcher(pids, clock, start_cost_s=1.0, max_jobs=1, idle_s=0.0)
    try:
        w.poll()
        assert list(w.jobs) == [old]
        clock.cpu += 10.0  # the watched sessions spent the budget
        clock.t += 1.0
        pids.append(new)
        w.poll()
        assert list(w.jobs) == [old] and w.dropped == 0 and w.deferred == {new}
        assert not w.jobs[old].session.stopped.is_set()
        clock.t += 3600.0  # the budget refilled: the idle job gives way, stop and start paid
        w.poll()
        assert list(w.jobs) == [new] and w.dropped == 1
        assert w.allowance is not None and w.allowance.start_cpu_s == 3.0
    finally:
        w.close()


def test_the_allowance_holds_at_most_its_span_and_owes_at_most_as_much():
    from gpudiag.agent.session.budget import CpuAllowance

    clock = _Clock()
    a = CpuAllowance(0.10, clock.cpu_s, clock=clock.now, hold_s=30.0)
    assert a.update() == pytest.approx(3.0)
    clock.t += 1000.0
    assert a.update() == pytest.approx(3.0)  # a quiet spell is not saved up
    clock.cpu += 100.0
    assert a.update() == pytest.approx(-3.0)  # a spike owes at most 30 s of budget
    assert not a.allows_start()
    clock.t += 60.0
    assert a.allows_start()
    clock.t += 40.0
    a.update()
    assert a.recent_cores() == pytest.approx(0.0)  # nothing spent over the last 40 s


def test_the_steady_cpu_leaves_out_the_session_starts_measured_in_its_span():
    """What the jobs watched cost, for JobsFit: the starts (paid from the allowance) are not
    a cost that dropping a job would save."""
    from gpudiag.agent.session.budget import CpuAllowance

    clock = _Clock()
    a = CpuAllowance(0.10, clock.cpu_s, clock=clock.now, hold_s=30.0)
    assert a.steady_cores() is None  # no span yet

    def start() -> None:
        clock.cpu += 2.0

    a.charge(start)
    clock.t += 30.0
    clock.cpu += 1.5
    a.update()
    assert a.steady_cores() == pytest.approx(0.05)  # 1.5 CPU s in 30 s; the 2 s start left out
    assert a.recent_cores() == pytest.approx(3.5 / 30.0)
    clock.t += 40.0
    clock.cpu += 4.0
    a.update()
    assert a.steady_cores() == pytest.approx(0.10)  # the start is out of the span


def test_with_the_budget_spent_an_active_job_takes_an_idle_ones_place(monkeypatch):
    """An attacker whose idle 'jobs' keep watch over its budget must not blind it to a real
    job that comes later: while the budget is spent, a newcomer that used the CPU since the
    last poll takes the place of a job idle for idle_s (as many sessions as before), one a
    poll; an idle newcomer waits."""
    from gpudiag.agent.commands import watch

    clock = _Clock()
    idle_old, idle_new, busy_a, busy_b = _no_such_pids(4)
    cpu = {idle_old: 1.0, idle_new: 1.0, busy_a: 1.0, busy_b: 1.0}
    monkeypatch.setattr(watch, "cpu_s", lambda pid: cpu.get(pid, -1.0))
    pids = [idle_old]
    w, log = _budgeted_watcher(pids, clock, start_cost_s=1.0, max_jobs=1, idle_s=0.0)
    try:
        w.poll()
        clock.cpu += 10.0  # the budget is spent from here on
        clock.t += 5.0
        pids += [idle_new, busy_a, busy_b]
        w.poll()  # first look at the newcomers: none known active yet
        assert list(w.jobs) == [idle_old] and w.deferred == {idle_new, busy_a, busy_b}
        cpu[busy_a] += 1.0
        cpu[busy_b] += 1.0
        clock.t += 5.0
        w.poll()
        assert list(w.jobs) == [busy_a] and w.dropped == 1  # one swap a poll
        assert w.deferred == {idle_new} and w.waiting == {busy_b}  # busy_a just started
        assert w.allowance is not None and not w.allowance.allows_start()
    finally:
        w.close()


def test_past_its_budget_watch_drops_the_idle_jobs_its_cpu_cannot_pay_for(monkeypatch):
    """Issue 53 section 2: each watched job costs a floor however low its rates go (8 jobs,
    7 of them idle fakes, beside the hostile processes: 0.14 cores steady against 0.10).
    When watch's steady CPU (session starts left out) is over its budget for 30 s, the jobs
    idle the longest are dropped, as many as their mean cost says go over it, said in the log
    and /metrics, and no more start; under 80% of it for 30 s with a job waiting, one more
    fits."""
    from gpudiag.agent.commands import watch

    clock = _Clock()
    pids = _no_such_pids(9)
    cpu = dict.fromkeys(pids, 1.0)
    monkeypatch.setattr(watch, "cpu_s", lambda pid: cpu.get(pid, -1.0))
    live = pids[:8]
    w, log = _budgeted_watcher(live, clock, start_cost_s=0.1, idle_s=0.0)
    try:
        w.poll()
        assert sorted(w.jobs) == pids[:8] and w.health()["jobs_fit"][0] == 8
        for _ in range(7):  # 35 s at 0.16 cores: over 0.10
            clock.t += 5.0
            clock.cpu += 0.8
            w.poll()
        # 0.02 cores a job: 3 jobs pay for the 0.06 over
        assert len(w.jobs) == 5 and w.dropped == 3, log
        assert w.health()["jobs_fit"][0] == 5 and w.health()["jobs_max"][0] == 8
        line = next(m for m in log if "job(s) at most now" in m)
        assert "over its budget" in line and "0.1" in line and "3 idle one(s) dropped" in line
        assert sum("no longer watched: idle" in m and "over its budget" in m for m in log) == 3
        for _ in range(3):  # spending on at 0.16 cores: no second drop within 30 s
            clock.t += 5.0
            clock.cpu += 0.8
            w.poll()
        assert len(w.jobs) == 5
        w.idle_s = 3600.0  # every job watched is in use now: a newcomer waits
        live.append(pids[8])
        for _ in range(8):  # 40 s at 0.05 cores: under 80% of the budget
            clock.t += 5.0
            clock.cpu += 0.25
            w.poll()
        assert pids[8] in w.jobs and w.health()["jobs_fit"][0] == 6, log
        assert any("under its budget" in m and "6 job(s) at most now" in m for m in log)
    finally:
        w.close()


def test_a_job_whose_stacks_cost_past_its_share_is_paced_said_in_the_log_report_and_metrics(
    monkeypatch,
):
    """Issue 53 N65: beside 1,500 idle threads, py-spy at watch's lowest rate (1 Hz) cost
    about 0.15 cores against the job's share (0.0125 of 0.10 for 8 jobs). The stack probe
    now rests between windows for what each window's measured cost buys at its goal, and
    says so: a log line, the report's probe status (degraded, with the fix), and /metrics'
    gpudiag_stacks_sampled_ratio and gpudiag_threads_read_per_tick; stopped past the longest
    rest (probe_up 0)."""
    import os

    from gpudiag.agent.base.config import Settings
    from gpudiag.agent.commands.watch import SharedGovernor
    from gpudiag.agent.fleet.identity import identity_from
    from gpudiag.agent.session.budget import Budget
    from gpudiag.agent.session.live import live_doc
    from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
    from gpudiag.analyzers.model.thresholds import Thresholds
    from gpudiag.probes.base import ProbeStatus, Target
    from tests.agent.test_metrics import _families
    from tests.probes.test_stacks_pace import _Burnt, _window

    log: list[str] = []
    session: Session | None = None

    class OneTick(_Burnt):
        def sample(self):  # one tick of the session's loop for this probe, then it stops
            assert session is not None
            session.stop()
            return []

    probe = OneTick()
    gov = SharedGovernor(Budget(0.10 / 8, 50 << 20), [probe], shared=SharedCpu(lambda: 0.0))
    session = Session(
        Target(os.getpid()),
        Settings(Thresholds(), (), None),
        SessionOptions(cpu_budget=None, progress=False),
        SessionParts(probes=[probe], log=log.append, governor=lambda probes: gov),
    )
    session.statuses["stacks"] = ProbeStatus("stacks", True)
    probe.target = Target(os.getpid())
    probe.set_level(0.01)
    _window(probe, 1.2, monkeypatch)  # 1.2 CPU s in a 10 s window at 1 Hz: past its goal
    session._run_probe(probe)
    assert any(m.startswith("stacks: stack sampling paced") for m in log), log
    gov.step()

    def scrape() -> tuple[dict, dict]:
        doc = live_doc(session, "attach", ["python", "t.py"], os.getpid())
        ident = identity_from(os.getpid(), ["python", "t.py"], "", {}, "u", "node1")
        return doc, _families(doc, ident)

    doc, fams = scrape()
    (stacks,) = [p for p in doc["probes"] if p["name"] == "stacks"]
    assert stacks["available"] and "paced" in stacks["reason"] and stacks["hint"]
    (ratio,) = fams["gpudiag_stacks_sampled_ratio"]
    assert 0.0 < ratio.value < 0.1
    read = {s.labels["probe"]: s.value for s in fams["gpudiag_threads_read_per_tick"]}
    assert read == {"stacks": 1500.0}
    assert {s.labels["probe"]: s.value for s in fams["gpudiag_probe_up"]}["stacks"] == 1.0

    _window(probe, 100.0, monkeypatch)  # a window an hour's rest would pay for: stopped
    gov.step()
    doc, fams = scrape()
    (stacks,) = [p for p in doc["probes"] if p["name"] == "stacks"]
    assert not stacks["available"] and "stopped" in stacks["reason"]
    assert fams["gpudiag_stacks_sampled_ratio"][0].value == 0.0
    assert {s.labels["probe"]: s.value for s in fams["gpudiag_probe_up"]}["stacks"] == 0.0
