"""End to end: host and process probes read the real /proc: contract tests (samples match
fields)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gpudiag.probes.base import Target
from gpudiag.probes.host.process import (
    ProcessProbe,
    cores_available,
)
from tests.probes.test_procfs import _check_contract


def test_process_probe_sees_children_and_threads():
    code = (
        "import multiprocessing as mp, time\n"
        "def spin():\n    t=time.time()\n    while time.time()-t<3: pass\n"
        "if __name__=='__main__':\n"
        "    ps=[mp.Process(target=spin) for _ in range(2)]\n"
        "    [p.start() for p in ps]; [p.join() for p in ps]\n"
    )
    job = subprocess.Popen([sys.executable, "-c", code])
    try:
        probe = ProcessProbe()
        assert probe.open(Target(job.pid)).available
        time.sleep(1.0)
        probe.sample()
        time.sleep(0.2)  # the workers' aggregate (one read per child) comes at its own pace
        assert not [s for s in probe.sample() if s.labels.get("scope") == "workers"]
        time.sleep(1.0)
        samples = probe.sample()
        _check_contract(probe, samples)
        workers = [s for s in samples if s.labels.get("scope") == "workers"][0]
        assert workers.values["procs"] == 2.0
        # two spinning children on <=2 cores; a box busy with other work gives them less
        assert 0.1 < workers.values["cpu_cores"] <= 2.5
        threads = [s for s in samples if s.labels.get("scope") == "thread"]
        assert any(s.labels["tid"] == str(job.pid) for s in threads)
    finally:
        job.kill()
        job.wait()


def test_process_probe_counts_workers_recreated_and_the_jobs_cores():
    """Children started in generations (a DataLoader without persistent workers): every one
    that started and ended is counted, and the cores the job may use are reported."""
    code = (
        "import multiprocessing as mp, time\n"
        "def nap():\n    time.sleep(0.4)\n"
        "if __name__=='__main__':\n"
        "    time.sleep(0.5)\n"
        "    for _ in range(3):\n"
        "        ps=[mp.Process(target=nap) for _ in range(2)]\n"
        "        [p.start() for p in ps]; [p.join() for p in ps]; time.sleep(0.2)\n"
        "    time.sleep(5)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", code])
    try:
        probe = ProcessProbe()
        assert probe.open(Target(job.pid)).available
        samples = []
        for _ in range(20):
            time.sleep(0.2)
            samples += probe.sample()
        _check_contract(probe, samples)
        workers = [s.values for s in samples if s.labels.get("scope") == "workers"]
        assert sum(v["worker_starts"] for v in workers) == 6
        assert sum(v["worker_exits"] for v in workers) == 6
        target = [s.values for s in samples if s.labels.get("scope") == "target"]
        cpus = [v["cpus_allowed"] for v in target if "cpus_allowed" in v]
        assert cpus and cpus[0] == cores_available(os.getpid())
    finally:
        job.kill()
        job.wait()


def test_a_job_of_many_idle_threads_costs_one_budget_of_reads_per_tick(monkeypatch):
    """N65: 1,500 idle threads cost 26 times the CPU budget (every thread's stat and
    schedstat read every tick). Now at most MAX_THREADS_PER_TICK threads are read a tick:
    the main thread and a busy one every tick, the idle rest in turn."""
    from gpudiag.probes.host import process

    job = _threads_job(1200, spin=True)
    try:
        reads: list[int] = []
        real = process.read_threads

        def counted(pid, tids=None):
            got = real(pid) if tids is None else real(pid, tids)
            reads.append(len(got))
            return got

        monkeypatch.setattr(process, "read_threads", counted)
        probe = process.ProcessProbe()
        assert probe.open(Target(job.pid)).available
        seen: set[str] = set()
        per_tick = []
        for _ in range(14):
            time.sleep(0.05)
            samples = probe.sample()
            tids = [s.labels["tid"] for s in samples if s.labels.get("scope") == "thread"]
            per_tick.append(tids)
            seen.update(tids)
        target = next(s for s in samples if s.labels.get("scope") == "target")
    finally:
        job.kill()
        job.wait()
    limit = process.MAX_THREADS_PER_TICK
    assert max(reads) <= limit and all(len(t) <= limit for t in per_tick)
    assert target.values["threads"] >= 1200  # all of them counted, a budget of them read
    assert len(seen) >= 1200, "every thread is read every few ticks"
    assert all(str(job.pid) in t for t in per_tick), "the main thread every tick"
    busy = [tid for tid in seen if all(tid in t for t in per_tick[-4:])]
    assert len(busy) >= 2  # the main thread and the spinning one, once it was seen busy


def test_at_the_lowest_level_fewer_threads_are_read_per_tick_and_it_is_said():
    """Under watch, with many jobs sharing its budget, a job's level falls to 0.01: the
    threads read per tick fall with it (256 times the level's square root, 16 at least), said
    in the log once and in the rates /metrics reads (gpudiag_threads_read_per_tick)."""
    from gpudiag.probes.host import process

    job = _threads_job(200)
    try:
        probe = process.ProcessProbe()
        assert probe.open(Target(job.pid)).available
        probe.sample()
        assert probe.notes() == [] and probe.rates()["process_threads_per_tick"] == 201
        probe.set_level(0.01)
        per_tick = []
        for _ in range(3):
            samples = probe.sample()
            per_tick.append(sum(1 for s in samples if s.labels.get("scope") == "thread"))
        (note,) = probe.notes()
        assert probe.notes() == []  # said once
        assert probe.rates()["process_threads_per_tick"] == 26
        probe.set_level(1.0)
        probe.sample()
        back = probe.notes()
    finally:
        job.kill()
        job.wait()
    assert max(per_tick) == 26, per_tick
    assert "201 threads, 26 read per tick" in note and "every 8 ticks" in note
    assert back == ["201 threads: every one read per tick again"]


def _threads_job(idle: int, spin: bool = False) -> subprocess.Popen:
    """A process with `idle` waiting threads (and one busy one with `spin`), once started."""
    code = (
        "import threading, time\n"
        "ev = threading.Event()\n"
        f"ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range({idle})]\n"
        "[t.start() for t in ts]\n"
        "def spin():\n"
        "    while True: sum(range(1000))\n"
        + ("threading.Thread(target=spin, daemon=True).start()\n" if spin else "")
        + "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert job.stdout is not None and job.stdout.readline().strip() == "ready"
    return job
