"""Process probe: the target, its threads and its children (DataLoader workers), from procfs."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpudiag.probes.base import Field, Probe, ProbeStatus, Sample, Target, now_ns
from gpudiag.probes.files import descendants
from gpudiag.probes.host.probe import CGROUP_ROOT, cgroup_dir


@dataclass
class ThreadStat:
    """One thread's state letter and scheduler counters (ns on CPU, ns waiting to run)."""

    tid: int
    comm: str
    state: str
    run_ns: int
    wait_ns: int


def parse_stat_line(text: str) -> tuple[str, str]:
    """Return (comm, state letter) from a /proc/.../stat line; comm may hold spaces or ')'."""
    lpar, rpar = text.index("("), text.rindex(")")
    return text[lpar + 1 : rpar], text[rpar + 2 : rpar + 3]


MAX_THREADS_PER_TICK = 256  # threads of one process read per tick (two small files each)
MIN_THREADS_PER_TICK = 16  # ... at the budget's lowest level (it scales as its square root:
# 26 at watch's 0.01, when many jobs share its budget)


def list_tids(pid: int) -> list[int]:
    """The thread ids of a process ([] when it is gone)."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except OSError:
        return []


def read_threads(pid: int, tids: list[int] | None = None) -> list[ThreadStat]:
    """Read the threads `tids` (every thread when None) of a process from /proc; threads
    that vanish mid-read are skipped."""
    out: list[ThreadStat] = []
    base = f"/proc/{pid}/task"
    for tid in list_tids(pid) if tids is None else tids:
        try:
            with open(f"{base}/{tid}/stat") as f:
                comm, state = parse_stat_line(f.read())
            with open(f"{base}/{tid}/schedstat") as f:
                run_ns, wait_ns, *_ = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
        out.append(ThreadStat(int(tid), comm, state, run_ns, wait_ns))
    return out


class ThreadBudget:
    """Which threads of a process to read this tick: all of them up to `limit`; past it the
    main thread, those busy at their last read (up to half the budget), and the rest in
    turn, so that every thread is read every few ticks and one tick costs `limit` reads
    however many idle threads the job starts."""

    def __init__(self, limit: int = MAX_THREADS_PER_TICK) -> None:
        self.limit = limit
        self._turn: dict[int, int] = {}  # pid -> where the rotation stands
        self.hot: set[int] = set()  # tids busy at their last read

    def choose(self, pid: int, tids: list[int]) -> list[int]:
        """The tids to read now."""
        if len(tids) <= self.limit:
            return tids
        first = [pid] if pid in tids else []
        hot = [t for t in tids if t in self.hot and t != pid][: self.limit // 2]
        taken = set(first) | set(hot)
        rest = [t for t in tids if t not in taken]
        room = self.limit - len(taken)
        start = self._turn.get(pid, 0) % max(1, len(rest))
        chosen = rest[start : start + room]
        chosen += rest[: max(0, room - len(chosen))]
        if len(self._turn) > 4096:
            self._turn.clear()
        self._turn[pid] = start + room
        return first + hot + chosen

    def note(self, ts: ThreadStat, busy: bool) -> None:
        """Whether a thread was busy when read (it is then read every tick)."""
        if busy:
            self.hot.add(ts.tid)
        else:
            self.hot.discard(ts.tid)
        if len(self.hot) > 65536:
            self.hot.clear()


def parse_cpu_max(text: str) -> float | None:
    """Cores a cgroup v2 `cpu.max` line ("QUOTA PERIOD", or "max PERIOD") allows; None: no
    quota."""
    parts = text.split()
    if len(parts) < 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if period > 0 else None


def cgroup_quota_cores(pid: int, root: Path = CGROUP_ROOT) -> float | None:
    """The tightest CPU quota (cores) of a process's cgroup and its parents; None: none."""
    path = cgroup_dir(pid, root)
    best: float | None = None
    while path is not None and (path == root or root in path.parents):
        try:
            cores = parse_cpu_max((path / "cpu.max").read_text())
        except OSError:
            cores = None
        if cores is not None and (best is None or cores < best):
            best = cores
        if path == root:
            break
        path = path.parent
    return best


def cores_available(pid: int, root: Path = CGROUP_ROOT) -> float | None:
    """CPU cores a process may use: its affinity, capped by its cgroup's quota (rounded up:
    a quota of 1.5 cores lets 2 threads run at once, each throttled)."""
    try:
        cores = float(len(os.sched_getaffinity(pid)))
    except (AttributeError, OSError):
        return None
    quota = cgroup_quota_cores(pid, root)
    return min(cores, float(max(1, math.ceil(quota)))) if quota is not None else cores


class ProcessProbe(Probe):
    """Samples the target's threads (CPU, run-queue wait, state) and its process tree."""

    name = "process"
    interval_s = 0.2
    adaptive = True
    fields = (
        Field("cpu", "ratio", "gauge", "one thread's share of one core spent running (label tid)"),
        Field("runqueue_wait", "ratio", "gauge", "one thread's share of time runnable but waiting"),
        Field("running", "ratio", "gauge", "1 when the thread was in state R at the tick"),
        Field("d_state", "ratio", "gauge", "1 when the thread was in uninterruptible (D) sleep"),
        Field("cpu_cores", "cores", "gauge", "CPU used by the process group, in cores"),
        Field("rss_bytes", "bytes", "gauge", "resident memory of the process group"),
        Field("read_bytes_per_s", "bytes/s", "gauge", "bytes read from storage per second"),
        Field("ctx_voluntary_per_s", "1/s", "gauge", "voluntary context switches per second"),
        Field("ctx_involuntary_per_s", "1/s", "gauge", "involuntary context switches per second"),
        Field("procs", "count", "gauge", "processes in the group"),
        Field("threads", "count", "gauge", "threads in the group"),
        Field("d_state_share", "ratio", "gauge", "share of the group's threads in D state"),
        Field("running_share", "ratio", "gauge", "share of the group's threads in state R"),
        Field(
            "runqueue_cores",
            "cores",
            "gauge",
            "time the group's threads were runnable but waiting for a CPU, in cores",
        ),
        Field(
            "cpus_allowed",
            "cores",
            "gauge",
            "CPU cores the job may use: its affinity, capped by its cgroup's CPU quota",
        ),
        Field("worker_starts", "count", "gauge", "child processes that appeared since the last"),
        Field("worker_exits", "count", "gauge", "child processes that ended since the last"),
    )

    def __init__(self, interval_s: float = 0.2, workers_interval_s: float = 1.0) -> None:
        self.base_interval_s = self.interval_s = interval_s
        self.base_workers_interval_s = self.workers_interval_s = workers_interval_s
        self.target: Target | None = None
        self._root: psutil.Process | None = None
        self._children: dict[int, psutil.Process] = {}
        self._prev_threads: dict[int, tuple[ThreadStat, int]] = {}  # tid -> (stat, read at)
        self._budget = ThreadBudget()
        self._prev_proc: dict[int, tuple[float, int, int, int]] = {}
        self._prev_t: int = 0
        self._prev_scope_t: dict[str, int] = {}
        self._prev_wait: dict[int, int] = {}  # tid -> run-queue ns, for the groups' sums
        self._churn = (0, 0)  # children started and ended, seen by the last re-listing
        # the main thread's children, read every tick (cheap): a worker living less than the
        # workers' pace is still seen; None where the kernel has no task/*/children
        self._kids: set[int] | None = None
        self._kid_churn = [0, 0]
        self._n_threads = 0  # the target's threads at the last tick
        self._said_over = False  # whether the log was told they are past the budget

    def set_level(self, level: float) -> None:
        """Sample less at a lower budget level: threads every 0.2 s up to 1 s, and fewer of a
        process's threads read per tick (MAX_THREADS_PER_TICK times the level's square root,
        MIN_THREADS_PER_TICK at least), the workers' aggregate (one read per worker process)
        every 1 s up to 5 s."""
        level = max(0.01, min(1.0, level))
        self.interval_s = min(max(self.base_interval_s, 1.0), self.base_interval_s / level)
        self.workers_interval_s = min(
            max(self.base_workers_interval_s, 5.0), self.base_workers_interval_s / level
        )
        self._budget.limit = max(MIN_THREADS_PER_TICK, round(MAX_THREADS_PER_TICK * level**0.5))

    def rates(self) -> dict[str, float]:
        """Current sampling intervals, and the target's threads read per tick (all of them
        up to the budget's limit)."""
        n = self._n_threads or self._budget.limit
        return {
            "process_interval_s": self.interval_s,
            "process_workers_interval_s": self.workers_interval_s,
            "process_threads_per_tick": float(min(n, self._budget.limit)),
        }

    def notes(self) -> list[str]:
        """A line when the target's threads go past what is read per tick (and back)."""
        over = self._n_threads > self._budget.limit
        if over == self._said_over:
            return []
        self._said_over = over
        if not over:
            return [f"{self._n_threads} threads: every one read per tick again"]
        every = math.ceil(self._n_threads / max(1, self._budget.limit))
        return [
            f"{self._n_threads} threads, {self._budget.limit} read per tick (the budget's "
            f"threads per tick at this level): the main thread and the busy ones every tick, "
            f"the idle rest in turn (each about every {every} ticks)"
        ]

    def open(self, target: Target) -> ProbeStatus:
        """Check the target exists and that its /proc entries can be read."""
        self.target = target
        try:
            self._root = psutil.Process(target.pid)
            self._root.cpu_times()
        except psutil.NoSuchProcess:
            return ProbeStatus(self.name, False, f"no process with pid {target.pid}")
        except psutil.AccessDenied:
            return ProbeStatus(
                self.name,
                False,
                f"no permission to read /proc/{target.pid}",
                "run gpudiag as the job's user or as root",
            )
        self._prev_t = now_ns()
        self._kids = self._direct_children()
        self._prev_scope_t = {"target": self._prev_t, "workers": self._prev_t}
        for ts in read_threads(target.pid, self._budget.choose(target.pid, list_tids(target.pid))):
            self._prev_threads[ts.tid] = (ts, self._prev_t)
        for proc in [self._root, *self._refresh_children()]:
            self._counters(proc, baseline=True)
        return ProbeStatus(self.name, True)

    def _refresh_children(self) -> list[psutil.Process]:
        """Re-list the target's children (each thread's children file: no scan of the box)."""
        assert self._root is not None
        alive = {}
        for pid in descendants(self._root.pid):
            known = self._children.get(pid)
            try:
                alive[pid] = known if known is not None else psutil.Process(pid)
            except psutil.Error:
                continue
        self._churn = (
            len(alive.keys() - self._children.keys()),
            len(self._children.keys() - alive.keys()),
        )
        self._children = alive
        return list(alive.values())

    def _direct_children(self) -> set[int] | None:
        """The pids the target's main thread started (/proc/PID/task/PID/children)."""
        pid = self._root_pid
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return {int(x) for x in f.read().split()}
        except (OSError, ValueError):
            return None

    def _track_children(self) -> None:
        """Count the main thread's children that appeared and ended since the last tick."""
        if self._kids is None:
            return
        now = self._direct_children()
        if now is None:
            return
        self._kid_churn[0] += len(now - self._kids)
        self._kid_churn[1] += len(self._kids - now)
        self._kids = now

    def _take_churn(self) -> tuple[int, int]:
        """Children started and ended since the workers' last aggregate: from every tick's
        read of the main thread's children, else from the re-listings."""
        if self._kids is None:
            return self._churn
        out = (self._kid_churn[0], self._kid_churn[1])
        self._kid_churn = [0, 0]
        return out

    def _counters(
        self, proc: psutil.Process, baseline: bool = False
    ) -> tuple[float, int, int, int, int] | None:
        """Return deltas (cpu_s, read_bytes, vol, invol, rss) since last tick for one process."""
        try:
            with proc.oneshot():
                ct = proc.cpu_times()
                cpu = ct.user + ct.system
                try:
                    rb = proc.io_counters().read_bytes
                except (psutil.AccessDenied, AttributeError):
                    rb = 0
                cs = proc.num_ctx_switches()
                rss = proc.memory_info().rss
        except psutil.Error:
            return None
        prev = self._prev_proc.get(proc.pid)
        cur = (cpu, rb, cs.voluntary, cs.involuntary)
        self._prev_proc[proc.pid] = cur
        if baseline:
            return None
        if prev is None:
            prev = (0.0, rb, cs.voluntary, cs.involuntary) if proc.pid != self._root_pid else cur
        return (cur[0] - prev[0], cur[1] - prev[1], cur[2] - prev[2], cur[3] - prev[3], rss)

    @property
    def _root_pid(self) -> int:
        return self.target.pid if self.target else -1

    def sample(self) -> list[Sample]:
        """One tick: per-thread samples of the target, and aggregates for target and workers."""
        assert self.target is not None
        t = now_ns()
        dt = max(1, t - self._prev_t)
        self._prev_t = t
        samples: list[Sample] = []
        tids = list_tids(self.target.pid)
        threads = read_threads(self.target.pid, self._budget.choose(self.target.pid, tids))
        if not threads and not psutil.pid_exists(self.target.pid):
            return []
        alive = set(tids)
        cur_threads = {k: v for k, v in self._prev_threads.items() if k in alive}
        for ts in threads:
            samples.append(self._thread_sample(ts, t, dt))
            cur_threads[ts.tid] = (ts, t)
        self._prev_threads = cur_threads
        self._n_threads = len(tids)
        self._track_children()
        assert self._root is not None
        target = self._aggregate("target", [self._root], t, threads)
        samples.append(target)
        if (t - self._prev_scope_t.get("workers", 0)) / 1e9 >= self.workers_interval_s * 0.95:
            kids = self._refresh_children()
            seen = {self.target.pid} | {p.pid for p in kids}
            for pid in list(self._prev_proc):
                if pid not in seen:
                    del self._prev_proc[pid]
            workers = self._aggregate("workers", kids, t, threads)
            started, ended = self._take_churn()
            workers.values["worker_starts"] = float(started)
            workers.values["worker_exits"] = float(ended)
            samples.append(workers)
            cpus = cores_available(self.target.pid)  # at the workers' pace: a re-read is rare
            if cpus is not None:
                target.values["cpus_allowed"] = cpus
        return samples

    def _thread_sample(self, ts: ThreadStat, t: int, dt: int) -> Sample:
        """One thread's sample: its CPU and run-queue shares since it was last read."""
        got = self._prev_threads.get(ts.tid)
        vals: dict[str, float | None] = {
            "running": 1.0 if ts.state == "R" else 0.0,
            "d_state": 1.0 if ts.state == "D" else 0.0,
        }
        busy = ts.state in ("R", "D")
        if got is not None:
            prev, at = got
            span = max(1, t - at) if at else dt
            vals["cpu"] = min(1.0, max(0.0, (ts.run_ns - prev.run_ns) / span))
            vals["runqueue_wait"] = min(1.0, max(0.0, (ts.wait_ns - prev.wait_ns) / span))
            busy = busy or (vals["cpu"] or 0.0) > 0.01
        self._budget.note(ts, busy)
        labels = {"scope": "thread", "tid": str(ts.tid), "comm": ts.comm}
        return Sample(self.name, t, labels, vals)

    def _aggregate(
        self, scope: str, procs: list[psutil.Process], t: int, root_threads: list[ThreadStat]
    ) -> Sample:
        dt = max(1, t - self._prev_scope_t.get(scope, t - 1))
        self._prev_scope_t[scope] = t
        if len(self._prev_wait) > 65536:  # threads come and go (worker churn): stay bounded
            self._prev_wait.clear()
        cpu_s = rb = vol = invol = rss = 0.0
        n_threads = n_read = n_d = n_r = 0
        rq_ns = 0
        seen_wait = False
        for proc in procs:
            deltas = self._counters(proc)
            if deltas is not None:
                cpu_s += deltas[0]
                rb += deltas[1]
                vol += deltas[2]
                invol += deltas[3]
                rss += deltas[4]
            if proc.pid == self._root_pid:
                ths, listed = root_threads, self._n_threads
            else:
                tids = list_tids(proc.pid)
                ths, listed = read_threads(proc.pid, self._budget.choose(proc.pid, tids)), len(tids)
            n_threads += listed
            n_read += len(ths)
            n_d += sum(1 for x in ths if x.state == "D")
            n_r += sum(1 for x in ths if x.state == "R")
            for x in ths:
                before = self._prev_wait.get(x.tid)
                self._prev_wait[x.tid] = x.wait_ns
                if before is not None:
                    rq_ns += max(0, x.wait_ns - before)
                    seen_wait = True
        secs = dt / 1e9
        values: dict[str, float | None] = {
            "procs": float(len(procs)),
            "threads": float(n_threads),
        }
        if procs:
            values.update(
                {
                    "cpu_cores": max(0.0, cpu_s / secs),
                    "rss_bytes": rss,
                    "read_bytes_per_s": max(0.0, rb / secs),
                    "ctx_voluntary_per_s": max(0.0, vol / secs),
                    "ctx_involuntary_per_s": max(0.0, invol / secs),
                }
            )
        if seen_wait:
            values["runqueue_cores"] = rq_ns / dt
        if n_read:  # of the threads read this tick (all of them, up to the budget)
            values["d_state_share"] = n_d / n_read
            values["running_share"] = n_r / n_read
        return Sample(self.name, t, {"scope": scope}, values)

    def close(self) -> None:
        """Forget the process handles."""
        self._children.clear()
        self._prev_proc.clear()
        self._prev_wait.clear()
