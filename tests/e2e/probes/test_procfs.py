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


def test_a_look_at_a_many_thread_jobs_tree_reads_a_budget_of_threads(monkeypatch):
    """N65 beside watch: each look at a job's tree (the process, host, stacks, conns and
    Triton probes each make one a tick) read every thread's children list: 1,500 reads and
    25 ms of CPU per look for a job of 1,500 idle threads. Now at most CHILDREN_READS
    threads per look: the main thread's children at once, another thread's within
    threads / (CHILDREN_READS - 1) looks, and kept after that."""
    from gpudiag.probes import files

    code = (
        "import subprocess, threading, time\n"
        "ev = threading.Event()\n"
        "ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range(200)]\n"
        "[t.start() for t in ts]\n"
        "main = subprocess.Popen(['sleep', '60'])\n"
        "kids = []\n"
        "def spawn():\n"
        "    kids.append(subprocess.Popen(['sleep', '60'])); ev.wait()\n"
        "threading.Thread(target=spawn, daemon=True).start()\n"
        "while not kids: time.sleep(0.01)\n"
        "print(main.pid, kids[0].pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    reads: list[str] = []
    real = files.read_head

    def counted(path, limit):
        if str(path).endswith("/children"):
            reads.append(str(path))
        return real(path, limit)

    monkeypatch.setattr(files, "read_head", counted)
    limit = getattr(files, "CHILDREN_READS", 32)  # the budget (32: as written before it was)
    try:
        assert job.stdout is not None
        by_main, by_thread = (int(x) for x in job.stdout.readline().split())
        found, per_look = [], []
        for _ in range(9):  # 202 threads, 31 in turn a look: each read within 7 looks
            reads.clear()
            found.append(set(files.descendants(job.pid)))
            per_look.append(sum(1 for r in reads if f"/proc/{job.pid}/" in r))
    finally:
        for pid in (by_main, by_thread):
            os.kill(pid, 9)
        job.kill()
        job.wait()
    assert max(per_look) <= limit, per_look  # was 202 a look
    assert all(by_main in f for f in found)  # the main thread is read at every look
    first = next(i for i, f in enumerate(found) if by_thread in f)
    assert first <= 7 and all(by_thread in f for f in found[first:])
