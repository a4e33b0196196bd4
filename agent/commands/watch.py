"""`gpudiag watch`: the node daemon. Finds the GPU (or PyTorch) jobs on the box, profiles
each as `attach` does, serves their findings on the metrics endpoint, and drops a job that
ends. One CPU and one memory budget cover every watched job: each job's share is the total
divided by the number of jobs, and each job's governor counts its own py-spy recorders plus
its share of gpudiag's own process."""

from __future__ import annotations

import argparse
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import psutil

from gpudiag.agent.base.config import Settings
from gpudiag.agent.commands.fleet_options import MetricsArgs, metrics_options
from gpudiag.agent.commands.options import (
    FromArgs,
    SettingsArgs,
    bounded,
    budget,
    positive,
    price_options,
    rate,
    settings_options,
)
from gpudiag.agent.fleet.identity import job_identity
from gpudiag.agent.fleet.metrics import LiveJob, tree_cpu_s
from gpudiag.agent.session.budget import (
    SPY_SHARE,
    Budget,
    CpuAllowance,
    Governor,
    JobsFit,
)
from gpudiag.agent.session.live import live_doc
from gpudiag.agent.session.ranks.launch import is_launcher, primary_of
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
from gpudiag.probes.base import Target
from gpudiag.probes.dist.ranks import sibling_ranks
from gpudiag.probes.host.discovery import (
    TorchCheck,
    cpu_s,
    cpu_share,
    dcgm_process,
    find_jobs,
    list_processes,
    read_proc,
)
from gpudiag.probes.inject.gpudiag_hooks import attach_path
from gpudiag.probes.inprocess.channel import HookProbe
from gpudiag.probes.stacks.probe import StackProbe
from gpudiag.text.sink import say

if TYPE_CHECKING:
    from gpudiag.probes.gpu.probe import GpuProbe

# with many jobs under one budget, each job's sampling may go lower than attach's floor: the
# loop down to 1 Hz (a verdict then takes minutes, which a daemon has)
WATCH_MIN_LEVEL = 0.01
WATCH_MIN_RATE_HZ = 1


class SharedCpu:
    """gpudiag's own CPU time split evenly between the jobs it watches: a counter that grows
    by each interval's process CPU divided by the number of jobs during it."""

    def __init__(self, reader: Callable[[], float] | None = None) -> None:
        self._read = reader or (lambda: sum(psutil.Process().cpu_times()[:2]))
        self._lock = threading.Lock()
        self._last = self._read()
        self._share = 0.0
        self.jobs = 1

    def per_job_s(self) -> float:
        """CPU seconds of gpudiag's process attributed to each job so far."""
        with self._lock:
            now = self._read()
            self._share += (now - self._last) / max(1, self.jobs)
            self._last = now
            return self._share

    def set_jobs(self, n: int) -> None:
        """Count the time so far at the old number of jobs, then use `n`."""
        self.per_job_s()
        with self._lock:
            self.jobs = max(1, n)


@dataclass
class SharedGovernor(Governor):
    """A job's governor inside `watch`: its py-spy plus its share of the shared process."""

    shared: SharedCpu | None = None
    jobs: int = 1

    def _own_cpu_s(self) -> float:
        return self.shared.per_job_s() if self.shared else super()._own_cpu_s()

    def agent_rss_bytes(self) -> int:
        """This job's py-spy recorders and its share of gpudiag's resident memory."""
        own = psutil.Process().memory_info().rss // max(1, self.jobs)
        kids = sum(int(p.child_rss_bytes()) for p in self.probes)
        return own + kids

    def set_level(self, level: float) -> None:
        """As Governor.set_level, down to WATCH_MIN_LEVEL: many jobs share one budget."""
        self.level = max(WATCH_MIN_LEVEL, min(1.0, level))
        for p in self._adaptive():
            p.set_level(self.level)

    def rebudget(self, budget: Budget, jobs: int) -> None:
        """A new share of the total budget."""
        with self._lock:
            self.budget, self.jobs = budget, jobs
        for p in self._adaptive():
            p.cpu_goal = budget.cpu_cores * self.target_share * SPY_SHARE


MAX_JOBS = 8  # jobs one daemon watches at once (--max-jobs); past it the oldest idle one goes
IDLE_CPU_S = 0.05  # CPU seconds a job must use between two polls to count as active
IDLE_S = 30.0  # a job without that for this long may be dropped for a new one
BUSY_SHARE = 0.1  # cores over its lifetime for a new job to go before idle ones


@dataclass
class Watched:
    """One job under watch, and when it last used the CPU (for the jobs budget)."""

    session: Session
    live: LiveJob
    thread: threading.Thread
    cpu_s: float = -1.0
    active_at: float = field(default_factory=time.monotonic)


@dataclass
class Watcher:
    """Discovers jobs, keeps a session on each, and lists them for the metrics endpoint."""

    settings: Settings
    opts: SessionOptions
    cpu_budget: float | None = 0.10  # cores across every job; None: no limit
    rss_budget_bytes: int = 400 * 1024 * 1024
    match: re.Pattern[str] | None = None
    discover: Callable[[], list[int]] | None = None
    log: Callable[[str], None] = say
    refresh_s: float = 5.0
    recent_s: float | None = 600.0  # findings over the last this many seconds; None: all
    max_jobs: int = MAX_JOBS
    idle_s: float = IDLE_S
    jobs: dict[int, Watched] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)  # jobs left out: the budget was full
    deferred: set[int] = field(default_factory=set)  # jobs not started: the CPU was spent
    _cpu_seen: dict[int, float] = field(default_factory=dict)  # deferred jobs' CPU seconds
    dropped: int = 0  # idle jobs dropped for newer ones
    # the CPU budget over watch's whole cost (its process, every py-spy and dump, live or
    # ended): session starts and the stops they replace are paid from it, and wait when it
    # is spent; None: made from cpu_budget (no limit: none)
    allowance: CpuAllowance | None = None
    # how many jobs that budget pays for (at most max_jobs); None: made with the allowance
    fit: JobsFit | None = None
    _poll_at: float = 0.0
    shared: SharedCpu = field(default_factory=SharedCpu)
    torch_check: TorchCheck = field(default_factory=TorchCheck)
    _gpu: GpuProbe | Literal[False] | None = None  # False: no GPU to ask
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.allowance is None and self.cpu_budget is not None:
            self.allowance = CpuAllowance(self.cpu_budget, tree_cpu_s)
        if self.fit is None and self.allowance is not None:
            self.fit = JobsFit(self.max_jobs, self.allowance.cores, self.allowance.hold_s)

    def most_jobs(self) -> int:
        """The jobs watched at most now: --max-jobs, or fewer when the CPU budget pays for
        fewer (JobsFit)."""
        return self.max_jobs if self.fit is None else min(self.max_jobs, self.fit.fit)

    # ---- discovery ------------------------------------------------------------------------
    def _gpu_pids(self) -> list[int]:
        from gpudiag.probes.gpu.probe import GpuProbe

        if self._gpu is None:
            probe = GpuProbe()
            self._gpu = probe if probe.open(Target(0)).available else False
        return list(self._gpu.compute_processes()) if self._gpu else []

    def candidates(self) -> list[int]:
        """The root pids of the jobs on the box now."""
        if self.discover is not None:
            return self.discover()
        with self._lock:
            known = set(self.jobs)
        return find_jobs(
            list_processes(), self._gpu_pids(), self.torch_check, match=self.match, known=known
        )

    # ---- jobs -----------------------------------------------------------------------------
    def live_jobs(self) -> list[LiveJob]:
        """The jobs the endpoint shows: those still being profiled."""
        with self._lock:
            return [w.live for w in self.jobs.values() if w.thread.is_alive()]

    def poll(self) -> None:
        """Start watching new jobs, drop ended ones, and share the budget out again."""
        pids = set(self.candidates())
        with self._lock:
            for pid, w in list(self.jobs.items()):
                if not w.thread.is_alive():
                    del self.jobs[pid]
                    self.log(f"pid {pid} ended; no longer watched")
        self.skipped &= pids  # a pid that comes back later is another process
        self._note_activity()
        self._fit_to_budget()
        # busy ones first (a tenth of a core or more over their lifetime), then by pid: when
        # places are few, a real job does not wait behind idle ones with lower pids
        new = sorted(
            pids - set(self.jobs) - self.skipped, key=lambda p: (cpu_share(p) < BUSY_SHARE, p)
        )
        self.waiting, deferred = set(), set()
        swapped = False
        looked = False  # the allowance is read once a poll (and after each start, charged)
        for pid in new:
            # a job that cannot start now costs no more (a look for its ranks scans the box)
            full = len(self.jobs) >= self.most_jobs()
            if full and self._idle_job() is None:
                self.waiting.add(pid)
                continue
            ok = self.allowance is None or self.allowance.allows_start(look=not looked)
            looked = True
            if not ok:
                if swapped or not full or not self._newcomer_active(pid):
                    deferred.add(pid)  # looked at again next poll; no watched job stopped
                    continue
                swapped = True  # an active job for an idle one: as many sessions as before
            ranks = sibling_ranks(pid)
            info = read_proc(pid)
            if not ranks and info is not None and is_launcher(list(info.cmdline)):
                continue  # a launcher (torchrun) before its ranks start: look again next time
            self._admit(pid, full, min(self.most_jobs(), len(self.jobs) + len(new)), ranks)
        if self.waiting:
            self.log(
                f"{len(self.waiting)} job(s) not watched: {self.most_jobs()} already, none idle "
                f"(--max-jobs {self.max_jobs}{self._fit_words()}; pids {_pids(self.waiting)})"
            )
        if deferred and deferred != self.deferred and self.allowance is not None:
            self.log(
                f"{len(deferred)} job(s) deferred: {self.allowance.spent_line()}; they start "
                f"when it allows, and the watched jobs keep theirs (pids {_pids(deferred)})"
            )
        self.deferred = deferred
        self._cpu_seen = {p: c for p, c in self._cpu_seen.items() if p in deferred}
        self._rebalance()

    def _newcomer_active(self, pid: int) -> bool:
        """Whether a job not started used the CPU since the last poll looked at it (an
        active job may take an idle one's place while the budget is spent: the sessions, and
        so their cost, stay as many; an idle one's place is not worth a start then)."""
        cpu, before = cpu_s(pid), self._cpu_seen.get(pid)
        self._cpu_seen[pid] = cpu
        return before is not None and before >= 0 and cpu - before > IDLE_CPU_S

    def _admit(self, pid: int, full: bool, jobs: int, ranks: list) -> None:
        """Start watching `pid`, first stopping the job idle the longest when `full`; what
        the stop and the start cost is measured and paid from the allowance."""

        def work() -> None:
            if not full or self._drop_idle(pid):
                self._start(pid, jobs, ranks)

        if self.allowance is None:
            work()
        else:
            self.allowance.charge(work)

    def _note_activity(self) -> None:
        """Each watched job's CPU time now; a job whose CPU grew is active now."""
        now = self._poll_at = time.monotonic()
        with self._lock:
            watched = list(self.jobs.items())
        for pid, w in watched:
            cpu = cpu_s(pid)
            if cpu - w.cpu_s > IDLE_CPU_S or w.cpu_s < 0:  # (first look: counted from now)
                w.active_at = now
            w.cpu_s = cpu

    def _idle_job(self) -> int | None:
        """The watched job idle the longest (no CPU for `idle_s` or more); None: none is."""
        with self._lock:
            idle = [
                (w.active_at, pid)
                for pid, w in self.jobs.items()
                if self._poll_at - w.active_at >= self.idle_s
            ]
        return min(idle)[1] if idle else None

    def _drop_idle(self, newcomer: int) -> bool:
        """Make room for `newcomer`: stop the job idle the longest (no CPU for `idle_s` or
        more), said in the log; False when every watched job is active."""
        why = f"and pid {newcomer} is new ({self.most_jobs()} jobs at most: --max-jobs"
        return self._stop_idle(why + f" {self.max_jobs}{self._fit_words()})")

    def _stop_idle(self, why: str) -> bool:
        """Stop the job idle the longest, said in the log with `why`; False: none is idle."""
        pid = self._idle_job()
        if pid is None:
            return False
        with self._lock:
            w = self.jobs.pop(pid)
        w.session.stop()
        self.skipped.add(pid)
        self.dropped += 1
        self.log(
            f"pid {pid} no longer watched: idle for {time.monotonic() - w.active_at:.0f} s, " + why
        )
        return True

    def _fit_words(self) -> str:
        if self.fit is None or self.fit.fit >= self.max_jobs:
            return ""
        return f"; the CPU budget pays for {self.fit.fit}"

    def _fit_to_budget(self) -> None:
        """Hold watch's steady CPU to its budget by the number of jobs (JobsFit): past it the
        jobs idle the longest are dropped, said in the log and /metrics, and no more start;
        under it, with jobs waiting, one more fits."""
        if self.fit is None or self.allowance is None:
            return
        self.allowance.update()
        now, steady = self.allowance.clock(), self.allowance.steady_cores()
        with self._lock:
            n = len(self.jobs)
        drop = self.fit.over(now, steady, n)
        if drop:
            assert steady is not None
            cost = (
                f"watch's CPU is over its budget ({steady:.3f} cores over the last "
                f"{self.allowance.hold_s:.0f} s with {n} jobs, session starts left out; budget "
                f"{self.allowance.cores:.3f})"
            )
            gone = 0
            while gone < drop and self._stop_idle(f"and {cost}"):
                gone += 1
            with self._lock:
                stay = len(self.jobs)
            was = self.fit.fit
            self.fit.dropped(now, stay)
            if gone or self.fit.fit != was:
                self.log(
                    f"{cost}: {self.fit.fit} job(s) at most now (--max-jobs {self.max_jobs}; "
                    f"{gone} idle one(s) dropped{', none idle' if gone < drop else ''})"
                )
        elif self.fit.grow(now, steady, n, bool(self.waiting or self.deferred)):
            self.log(
                f"watch's CPU is under its budget ({steady or 0.0:.3f} cores, budget "
                f"{self.allowance.cores:.3f}): {self.fit.fit} job(s) at most now"
            )

    def _start(self, pid: int, jobs: int = 1, ranks: list | None = None) -> None:
        """Attach to `pid` (and to its `ranks` when it is a launcher, as attach does); its
        probes' first guess is made at a share of `jobs`."""
        opts = SessionOptions(
            **{
                **self.opts.__dict__,
                "cpu_budget": None,
                "progress": False,
                "attached": True,
                "stacks_min_rate_hz": WATCH_MIN_RATE_HZ,
                "stacks_pace": True,
            }
        )
        ranks = ranks or []
        main = next((r.pid for r in ranks if r.pid == pid), primary_of(ranks).pid) if ranks else pid
        governor = None
        if self.cpu_budget is not None:
            n = max(1, jobs)
            budget = Budget(self.cpu_budget / n, self.rss_budget_bytes // n)
            governor = lambda probes: SharedGovernor(  # noqa: E731
                budget, probes, period_s=max(1.0, opts.window_s), shared=self.shared, jobs=n
            )
        ident = job_identity(pid)
        command = ident["command"].split()

        def report() -> dict:
            return live_doc(session, "attach", command, pid, self.recent_s)

        live = LiveJob(ident, report, refresh_s=self.refresh_s)
        parts = SessionParts(
            sink=live.tap,
            log=lambda msg: self.log(f"pid {pid}: {msg}"),
            hooks=HookProbe(attach_path(main), optional=True),
            ranks=(ranks, pid) if ranks else None,
            governor=governor,
        )
        session = Session(Target(main), self.settings, opts, parts)
        stacks = next(p for p in session.probes if isinstance(p, StackProbe))
        status = session.open_probe(stacks)
        if not status.available:
            for p in session.probes:
                if p is not stacks:
                    p.close()
            self.skipped.add(pid)
            self.log(f"pid {pid}: not watched: {status.reason}")
            return
        th = threading.Thread(
            target=session.run,
            kwargs={"preopened": {stacks.name: status}},
            name=f"gpudiag-watch-{pid}",
            daemon=True,
        )
        with self._lock:
            self.jobs[pid] = Watched(session, live, th)
        th.start()
        self.log(f"watching pid {pid} ({ident['command']})")

    def _rebalance(self) -> None:
        with self._lock:
            n = len(self.jobs)
            govs = [w.session.governor for w in self.jobs.values()]
        self.shared.set_jobs(n)
        if self.cpu_budget is None or n == 0:
            return
        share = Budget(self.cpu_budget / n, self.rss_budget_bytes // n)
        for g in govs:
            if isinstance(g, SharedGovernor):
                g.rebudget(share, n)

    def run(self, stop: threading.Event, interval_s: float = 5.0) -> None:
        """Poll until `stop` is set, then stop every session."""
        try:
            while True:
                self.poll()
                if stop.wait(interval_s):
                    break
        finally:
            self.close()

    def close(self) -> None:
        """Stop every session and wait for them."""
        with self._lock:
            watched = list(self.jobs.values())
        for w in watched:
            w.session.stop()
        for w in watched:
            w.thread.join(timeout=30)
        if self._gpu:
            self._gpu.close()

    def health(self) -> dict:
        """Node-level gauges for the endpoint."""
        with self._lock:
            n = sum(1 for w in self.jobs.values() if w.thread.is_alive())
        out = {
            "jobs_watched": (n, "jobs gpudiag watch profiles now"),
            "jobs_max": (self.max_jobs, "jobs it watches at most (--max-jobs)"),
            "jobs_fit": (
                self.most_jobs(),
                "jobs it watches at most now: --max-jobs, or fewer while its steady CPU is "
                "over its budget (the idle ones dropped first)",
            ),
            "jobs_not_watched": (
                len(self.waiting),
                "jobs found but not watched: the jobs budget was full and none idle",
            ),
            "jobs_dropped": (
                self.dropped,
                "idle jobs dropped for newer ones or for the CPU budget since it started",
            ),
            "dcgm_running": (
                1.0 if dcgm_process() is not None else 0.0,
                "1 when dcgm-exporter or nv-hostengine runs here (NVML GPM is then left off)",
            ),
        }
        if self.cpu_budget is not None:
            out["watch_cpu_budget_cores"] = (self.cpu_budget, "CPU budget across every job")
            out["watch_rss_budget_bytes"] = (self.rss_budget_bytes, "memory budget, every job")
        if self.allowance is not None:
            out["jobs_deferred"] = (
                len(self.deferred),
                "jobs found but not started: watch's CPU budget was spent (they start when "
                "it allows)",
            )
            out["watch_cpu_allowance_seconds"] = (
                self.allowance.balance_s,
                "CPU seconds of budget watch has left for session starts (negative: owed); "
                "its process and every child it ran, measured",
            )
            out["watch_session_start_cpu_seconds"] = (
                self.allowance.start_cpu_s,
                "CPU seconds watch spent starting sessions (and stopping the idle ones they "
                "replaced), measured around each",
            )
        return out


def _pids(pids: set[int]) -> str:
    """The first five pids, for a log line."""
    return ", ".join(map(str, sorted(pids)[:5]))


def wait_for(stop: threading.Event, duration_s: float | None) -> None:
    """Block until `stop` is set or `duration_s` passes (Ctrl-C sets it)."""
    t_end = None if duration_s is None else time.monotonic() + duration_s
    try:
        while not stop.is_set():
            left = None if t_end is None else t_end - time.monotonic()
            if left is not None and left <= 0:
                break
            stop.wait(0.5 if left is None else min(0.5, left))
    except KeyboardInterrupt:
        pass
    stop.set()


@dataclass(frozen=True, kw_only=True)
class WatchOptions(FromArgs, SettingsArgs, MetricsArgs):
    """`gpudiag watch`'s options, by --help's groups."""

    # stop
    duration: float | None = None
    # sampling
    cpu_budget: float = 10.0  # percent of one core, for every job together; 0: no limit
    memory_budget: float = 400.0  # MB, for every job together
    interval: float = 5.0
    recent: float = 600.0  # 0: the whole time a job was watched
    max_jobs: int = MAX_JOBS
    match: str | None = None
    rate: int = 100
    window: float = 3.0
    # output
    quiet: bool = False
    # fleet
    metrics_port: int = 9401


def watch_command(cfg: WatchOptions, settings: Settings) -> int:
    """`gpudiag watch`: serve every job's findings until Ctrl-C, SIGTERM or --duration."""
    import signal

    from gpudiag.agent.base.errors import UsageError
    from gpudiag.agent.fleet.server import MetricsServer

    match = None
    if cfg.match:
        try:
            match = re.compile(cfg.match)
        except re.error as exc:
            raise UsageError(f"--match is not a regular expression: {exc}") from None
    opts = SessionOptions(rate_hz=cfg.rate, window_s=cfg.window, progress=False)
    log = (lambda msg: None) if cfg.quiet else Watcher.log
    watcher = Watcher(
        settings,
        opts,
        cpu_budget=cfg.cpu_budget / 100.0 if cfg.cpu_budget else None,
        rss_budget_bytes=int(cfg.memory_budget * 1024 * 1024),
        match=match,
        log=log,
        recent_s=cfg.recent or None,
        max_jobs=cfg.max_jobs,
    )
    server = MetricsServer(
        cfg.metrics_addr,
        cfg.metrics_port,
        watcher.live_jobs,
        watcher.health,
        otlp=cfg.otlp_target(settings),
    )
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    log(f"watching the box; metrics on {server.url}")
    poller = threading.Thread(
        target=watcher.run, args=(stop, cfg.interval), name="gpudiag-watch", daemon=True
    )
    poller.start()
    try:
        wait_for(stop, cfg.duration)
        poller.join(timeout=60)
    finally:
        for job in watcher.live_jobs():  # --otlp: each job's verdict as a log record
            if job.last_doc is not None:
                server.finished(job.last_doc, job.labels)
        server.close()
    return 0


def main(opts: WatchOptions) -> int:
    """`gpudiag watch`: profile every job on the box and serve the findings until Ctrl-C,
    SIGTERM or --duration."""
    return watch_command(opts, opts.settings())


def _recent(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return v


def _jobs(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= v <= 256:
        raise argparse.ArgumentTypeError(f"must be from 1 to 256, got {text!r}")
    return v


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `watch` subcommand and its options."""
    p = sub.add_parser(
        "watch",
        help="node daemon: profile every PyTorch/GPU job on the box, serve /metrics",
        description="Find the GPU jobs on this box (NVML's process list, and Python "
        "processes with PyTorch loaded), profile each at a low cost within one CPU and "
        "memory budget for all of them, and serve their findings as Prometheus metrics "
        "until Ctrl-C or SIGTERM. A job that ends is dropped.",
    )
    stop = p.add_argument_group("stop", "when watching ends (default: Ctrl-C or SIGTERM)")
    sampling = p.add_argument_group("sampling", "which jobs, how they are sampled, at what cost")
    settings = p.add_argument_group("thresholds and prices")
    output = p.add_argument_group("output")
    fleet = p.add_argument_group("fleet", "the findings as Prometheus metrics and OTLP")
    metrics_options(fleet, 9401)
    sampling.add_argument(
        "--cpu-budget",
        type=budget,
        default=10.0,
        metavar="PERCENT",
        help="CPU for all watched jobs together, in percent of one core, shared "
        "evenly between them (default: 10; 0: no limit)",
    )
    sampling.add_argument(
        "--memory-budget",
        type=positive,
        default=400,
        metavar="MB",
        help="resident memory for all watched jobs together (default: 400)",
    )
    sampling.add_argument(
        "--interval",
        type=bounded(0.01, 86400.0, "seconds"),  # a wait the poller's clock can hold
        default=5.0,
        metavar="SECONDS",
        help="how often to look for new and ended jobs (default: 5)",
    )
    sampling.add_argument(
        "--recent",
        type=_recent,
        default=600.0,
        metavar="SECONDS",
        help="findings cover each job's last SECONDS, so that they follow a job that "
        "changes (default: 600; 0: the whole time it was watched)",
    )
    sampling.add_argument(
        "--max-jobs",
        type=_jobs,
        default=MAX_JOBS,
        metavar="N",
        help=f"watch at most N jobs at once; a new one then replaces the one idle the "
        f"longest, or waits; fewer while watch's steady CPU is over --cpu-budget, the idle "
        f"ones dropped first (default: {MAX_JOBS})",
    )
    sampling.add_argument(
        "--match",
        metavar="REGEX",
        help="watch only jobs whose command line matches REGEX",
    )
    stop.add_argument(
        "--duration",
        type=positive,
        metavar="SECONDS",
        help="stop after this many seconds (default: until Ctrl-C or SIGTERM)",
    )
    sampling.add_argument(
        "--rate", type=rate, default=100, metavar="HZ", help="py-spy rate at most"
    )
    sampling.add_argument(
        "--window", type=positive, default=3.0, metavar="SECONDS", help="py-spy window"
    )
    settings_options(settings, "thresholds and rules, as for run")
    price_options(settings)
    output.add_argument("-q", "--quiet", action="store_true", help="no log lines on stderr")
