"""The agent's own cost: measured, bounded, and written into the report.

gpudiag must not hurt the job it watches. The governor measures what the agent costs (the CPU
of gpudiag's own threads plus every py-spy recorder it ran, and their resident memory) and
scales the probes' sampling rates with one level (1.0 = the configured rates) so that the
sampling cost stays under a budget: by default 3% of one core and 150 MB, whatever the number
of DataLoader workers, threads and GPUs. It aims at `target_share` (70%) of the CPU budget, over the
recent periods and over the whole run, so that gpudiag's start-up and its final analysis fit
in the rest over a run of a minute or more.

The budget buys the verdict's samples first: until the stack probe has the loop samples a
verdict rests on (`verdict_samples`, with a margin for the set-up the analyzers leave out),
the governor aims at most of the budget (`VERDICT_SHARE`, for `VERDICT_MAX_S` at most); once
they are in, it tapers to `target_share` of the budget over the run since the loop was
found, paying back what the verdict's samples overspent, so that the cost of a long look
still averages under it. A `run`'s start-up, sampled before the loop is found, is not paid
back out of the loop.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from gpudiag.analyzers.measures.loop import profile_loop
from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.analyzers.measures.window import find_loop_window
from gpudiag.analyzers.timeline.timeline import Timeline

MIN_LEVEL = 0.05
SPY_SHARE = 0.7  # the part of the CPU goal the first guess gives py-spy
VERDICT_SHARE = 0.85  # the part of the CPU budget aimed at until the verdict has its samples
VERDICT_MAX_S = 30.0  # and for this long at most after the loop is found (bounds the overspend)
VERDICT_MARGIN = 1.2  # loop samples wanted per sample a verdict needs (a margin for the ones
# the analyzers drop: warm-up steps, the edges of the loop window)


BOX_SHARE = 0.015  # the default budget: 1.5% of the box's CPU ...
MIN_BUDGET_CORES = 0.03  # ... never under 3% of one core ...
MAX_BUDGET_CORES = 0.5  # ... nor over half of one


def default_cpu_budget(cores: int | None) -> float:
    """The default CPU budget in cores: 1.5% of the box (3% of one core on 2 cores, 24% on
    16). A fixed 3% of one core starved the stack probe on a 16-core H100 box: py-spy's cost
    per window on a CUDA process left 47 stack samples in 22 s, too few for any verdict,
    while 14 cores sat idle."""
    return round(min(MAX_BUDGET_CORES, max(MIN_BUDGET_CORES, BOX_SHARE * (cores or 1))), 4)


@dataclass(frozen=True)
class Budget:
    """What the agent may cost: CPU in cores (0.03 = 3% of one core) and resident bytes."""

    cpu_cores: float = 0.03
    rss_bytes: int = 150 * 1024 * 1024


@dataclass
class _RateStats:
    """Time-weighted mean, minimum and maximum of one sampling rate."""

    weighted: float = 0.0
    seconds: float = 0.0
    minimum: float = float("inf")
    maximum: float = float("-inf")

    def add(self, value: float, seconds: float) -> None:
        self.weighted += value * seconds
        self.seconds += seconds
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)

    def to_dict(self, last: float) -> dict:
        mean = self.weighted / self.seconds if self.seconds > 0 else last
        return {
            "mean": round(mean, 3),
            "min": round(min(self.minimum, last), 3),
            "max": round(max(self.maximum, last), 3),
            "last": round(last, 3),
        }


@dataclass
class Governor:
    """Measures the agent's CPU and memory each period and sets the probes' level."""

    budget: Budget
    probes: list[Any]
    period_s: float = 3.0
    target_share: float = 0.7
    verdict_samples: int = 0  # loop samples a verdict needs; 0: no verdict-first phase
    loop_samples: Callable[[], float] | None = None  # the loop thread's samples in the loop
    clock: Callable[[], float] = time.monotonic
    cpu_reader: Callable[[], float] | None = None
    rss_reader: Callable[[], int] | None = None
    level: float = 1.0
    adjustments: int = 0
    over_budget_periods: int = 0
    periods: int = 0
    peak_rss_bytes: int = 0
    rss_over_budget: bool = False
    _rates: dict[str, _RateStats] = field(default_factory=dict)
    _last: dict[str, float] = field(default_factory=dict)
    _t0: float | None = None
    _cpu0: float = 0.0
    _spy0: float = 0.0
    _prev_t: float | None = None
    _prev_cpu: float = 0.0
    _cost: float | None = None
    _hold_until: float = 0.0
    verdict_at_s: float | None = None  # when the verdict's samples were in (from start)
    _loop_t0: float | None = None
    _loop_cpu0: float = 0.0
    _before: tuple[float, float] = (0.0, 0.0)  # time and CPU at the previous step
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    # ---- measuring ----------------------------------------------------------------------
    def agent_cpu_s(self) -> float:
        """CPU seconds of gpudiag's threads and of its py-spy recorders so far."""
        if self.cpu_reader is not None:
            return self.cpu_reader()
        return self._own_cpu_s() + self._spy_cpu_s()

    def _own_cpu_s(self) -> float:
        ct = psutil.Process().cpu_times()
        return ct.user + ct.system

    def _spy_cpu_s(self) -> float:
        return sum(float(p.cpu_s()) for p in self.probes)

    def agent_rss_bytes(self) -> int:
        """Resident memory of gpudiag and of its py-spy recorders (their last window's peak)."""
        if self.rss_reader is not None:
            return self.rss_reader()
        own = psutil.Process().memory_info().rss
        kids = sum(int(p.child_rss_bytes()) for p in self.probes)
        return own + kids

    def early(self) -> bool:
        """True while the verdict still lacks its loop samples (the budget buys those first)."""
        if self.verdict_samples <= 0 or self.loop_samples is None or self.verdict_at_s is not None:
            return False
        now = self.clock()
        late = self._loop_t0 is not None and now - self._loop_t0 > VERDICT_MAX_S
        if late or self.loop_samples() >= self.verdict_samples * VERDICT_MARGIN:
            t0 = self._t0 if self._t0 is not None else now
            self.verdict_at_s = round(now - t0, 1)
            return False
        return True

    def _adaptive(self) -> list[Any]:
        return [p for p in self.probes if p.adaptive]

    def __post_init__(self) -> None:
        # py-spy's share of the goal, for the stack probe's first guess when it opens
        for p in self._adaptive():
            # a first guess from a thread count: kept at the long-run goal even while the
            # verdict's samples are bought (it misjudges a busy box; measurements raise it)
            p.cpu_goal = self.budget.cpu_cores * self.target_share * SPY_SHARE

    def adopt(self, probe: Any) -> None:
        """A probe added while the session runs (a late rank's stacks): the CPU goal the
        probes at the start got, and the level in force, before it opens."""
        if probe.adaptive:
            probe.cpu_goal = self.budget.cpu_cores * self.target_share * SPY_SHARE
            probe.set_level(self.level)

    # ---- control ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the governor's thread (the probes start at their own first guess)."""
        now = self.clock()
        self._t0 = self._prev_t = now
        self._cpu0 = self._prev_cpu = self.agent_cpu_s()
        self._spy0 = self._spy_cpu_s() if self.cpu_reader is None else 0.0
        self._thread = threading.Thread(target=self._run, name="gpudiag-budget", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.step()
            except Exception:  # measuring must never take the session down
                pass

    def set_level(self, level: float) -> None:
        """Apply a level to every adaptive probe."""
        self.level = max(MIN_LEVEL, min(1.0, level))
        for p in self._adaptive():
            p.set_level(self.level)

    def _settle_s(self) -> float:
        """How long until a new level is in force: the longest stack window."""
        windows = [float(p.rates().get("stacks_window_s", 0.0)) for p in self._adaptive()]
        return max(windows, default=0.0)

    def _record_rates(self, seconds: float) -> None:
        for p in self._adaptive():
            rates = p.rates()
            for k, v in rates.items():
                if seconds > 0 and k in self._last:
                    self._rates.setdefault(k, _RateStats()).add(self._last[k], seconds)
                self._last[k] = float(v)

    def step(self) -> None:
        """One period: measure the cost since the last step and move the level toward it."""
        with self._lock:  # summary() may be read from the UI thread meanwhile
            self._step()

    def _step(self) -> None:
        now = self.clock()
        cpu = self.agent_cpu_s()
        dt = now - (self._prev_t if self._prev_t is not None else now)
        self._record_rates(dt)
        if dt <= 0:
            return
        if self.periods == 0:  # take over from the probes' first guess
            levels = [float(p.level) for p in self._adaptive() if p.level is not None]
            self.set_level(min(levels, default=self.level))
        cost = max(0.0, (cpu - self._prev_cpu) / dt)
        self._before = (self._prev_t if self._prev_t is not None else now, self._prev_cpu)
        self._prev_t, self._prev_cpu = now, cpu
        self.periods += 1
        if cost > self.budget.cpu_cores:
            self.over_budget_periods += 1
        rss = self.agent_rss_bytes()
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        if rss > self.budget.rss_bytes:
            self.rss_over_budget = True
            for p in self.probes:
                p.shed_memory()
        if self._loop_t0 is None and (self.loop_samples is None or self.loop_samples() > 0):
            # the loop is found: what is spent from here on is paid back (once the verdict
            # has its samples); a `run`'s start-up before it is not
            self._loop_t0, self._loop_cpu0 = self._before
        if now < self._hold_until:  # the last change is not in force everywhere yet
            return
        self._cost = cost if self._cost is None else 0.5 * self._cost + 0.5 * cost
        early = self.early()
        goal = self.budget.cpu_cores * (VERDICT_SHARE if early else self.target_share)
        # the budget is an average: what was overspent (the first guess, a busy spell, the
        # verdict's samples) is paid back by looking at the whole run's cost as well as the
        # recent one, once the verdict has its samples
        t0, cpu0 = self._loop_t0 if self._loop_t0 is not None else now, self._loop_cpu0
        so_far = (cpu - cpu0) / max(1e-6, now - t0)
        payback = so_far if self.periods > 1 and not early and now - t0 > 0 else 0.0
        ratio = goal / max(self._cost, payback, 1e-6)
        # move only on a clear miss: rate changes are what the analyzers least like
        raise_at = 1.2 if early else 1.5  # the verdict's samples are worth a change
        # a paced probe rests between windows at its lowest rates: its cost over a rest
        # says nothing of what a higher rate would cost, so the level is never raised then
        paced = any(p.paced() for p in self._adaptive())
        if ratio < 1.0 or (ratio > raise_at and self.level < 1.0 and not paced):
            new = self.level * min(2.0, max(0.25, ratio)) ** 0.8
            if abs(new - self.level) > 0.01:
                self.adjustments += 1
                self.set_level(new)
                # a recorder keeps its rate to the end of its window: wait that long
                self._cost = None
                self._hold_until = now + self._settle_s()

    def stop(self) -> None:
        """Stop the governor's thread and take a last measurement."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.step()
        except Exception:
            pass

    # ---- report -------------------------------------------------------------------------
    def summary(self) -> dict:
        """The budget, what the agent measured itself at, and the effective sampling rates."""
        with self._lock:
            return self._summary()

    def _summary(self) -> dict:
        elapsed = (self._prev_t or 0.0) - (self._t0 if self._t0 is not None else 0.0)
        spent = self._prev_cpu - self._cpu0
        spy = self._spy_cpu_s() - self._spy0 if self.cpu_reader is None else None
        return {
            "cpu_budget_cores": self.budget.cpu_cores,
            "rss_budget_bytes": self.budget.rss_bytes,
            "cpu_cores": round(spent / elapsed, 5) if elapsed > 0 else None,
            "py_spy_cpu_cores": round(spy / elapsed, 5)
            if elapsed > 0 and spy is not None
            else None,
            "peak_rss_bytes": self.peak_rss_bytes or None,
            "rss_over_budget": self.rss_over_budget,
            "level": round(self.level, 3),
            "adjustments": self.adjustments,
            "verdict_samples": self.verdict_samples or None,
            "verdict_samples_at_s": self.verdict_at_s,
            "periods_over_budget": self.over_budget_periods,
            "periods": self.periods,
            "rates": {
                k: self._rates.get(k, _RateStats()).to_dict(v)
                for k, v in sorted(self._last.items())
            },
        }


def loop_window_samples(timeline: Timeline, classifier: Classifier) -> float:
    """Stack samples of the busiest target thread inside the loop window so far (the job's
    start-up left out, as the analyzers leave it out): what a verdict's samples count."""
    win = find_loop_window(timeline, classifier)
    if not win.found:  # no loop window (a loop mostly in the job's own code): the analyzers
        # then take the whole run less its start-up (imports); count what they count
        return profile_loop(timeline.whole(), classifier).samples
    agg = timeline.window(win.start_ns, win.end_ns)
    return max((sum(agg.stacks[k].values()) for k in agg.threads("all", "target")), default=0.0)


ALLOWANCE_S = 30.0  # seconds of budget an allowance holds at most: the burst a quiet spell buys


@dataclass
class CpuAllowance:
    """A CPU budget held against a measured counter (a token bucket in CPU seconds): it fills
    at `cores` CPU seconds a second, up to `cores * hold_s`, and empties by what `reader`
    measures (`watch`: its process and every child it ran, live or reaped), whatever spent
    it. It owes at most `hold_s` of budget. A start is allowed while the allowance holds what
    the starts so far cost on average (measured around each), so one overdraws it by one
    start at most."""

    cores: float
    reader: Callable[[], float]
    clock: Callable[[], float] = time.monotonic
    hold_s: float = ALLOWANCE_S
    balance_s: float = 0.0  # CPU seconds left (negative: owed)
    starts: int = 0
    start_cpu_s: float = 0.0  # measured around every start (and the stop it replaced)
    _t: float = 0.0
    _cpu: float = 0.0
    _history: list[tuple[float, float]] = field(default_factory=list)
    # each start's cost and the counter after it (a start after a window's first look: in it)
    _starts: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._t, self._cpu = self.clock(), self.reader()
        self.balance_s = self.cap_s
        self._history = [(self._t, self._cpu)]

    @property
    def cap_s(self) -> float:
        """The most it holds, in CPU seconds."""
        return self.cores * self.hold_s

    def update(self) -> float:
        """Measure: add the budget since the last look, take what was spent; the balance."""
        now, cpu = self.clock(), self.reader()
        gained = self.cores * max(0.0, now - self._t)
        spent = max(0.0, cpu - self._cpu)
        self.balance_s = max(-self.cap_s, min(self.cap_s, self.balance_s + gained) - spent)
        self._t, self._cpu = now, max(self._cpu, cpu)  # a child reaped mid-read dips it
        old = [i for i, (t, _) in enumerate(self._history) if now - t > self.hold_s]
        self._history = self._history[old[-1] if old else 0 :]  # one look before the span
        self._history.append((now, cpu))
        return self.balance_s

    def recent_cores(self) -> float | None:
        """CPU in cores from the last look before the last `hold_s` (None before two)."""
        (t0, c0), (t1, c1) = self._history[0], self._history[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None

    def steady_cores(self) -> float | None:
        """CPU in cores over the last `hold_s` or more, the session starts measured in it
        left out: what the jobs watched cost (None until the looks span `hold_s`)."""
        (t0, c0), (t1, c1) = self._history[0], self._history[-1]
        if t1 - t0 < self.hold_s:
            return None
        self._starts = [(after, c) for after, c in self._starts if after > c0]
        return max(0.0, c1 - c0 - sum(c for _, c in self._starts)) / (t1 - t0)

    def mean_start_s(self) -> float:
        """What a start has cost on average (0 before the first)."""
        return self.start_cpu_s / self.starts if self.starts else 0.0

    def allows_start(self, look: bool = True) -> bool:
        """True while the allowance holds one more start's measured cost; `look=False`: from
        the balance of the last look (a poll's later jobs: each look reads the CPU of watch's
        every thread and child)."""
        balance = self.update() if look else self.balance_s
        return balance >= self.mean_start_s() and balance >= 0.0

    def charge(self, work: Callable[[], object]) -> float:
        """Run `work` (a start) and measure what it cost; the CPU seconds."""
        before = self.reader()
        work()
        cost = max(0.0, self.reader() - before)
        self.starts += 1
        self.start_cpu_s += cost
        self.update()
        self._starts.append((self._cpu, cost))
        return cost

    def spent_line(self) -> str:
        """Why starts wait, with units."""
        recent = self.recent_cores()
        used = f"{recent:.3f} cores over the last {self.hold_s:.0f} s, " if recent else ""
        return (
            f"watch's CPU budget is spent ({used}budget {self.cores:.3f} cores; "
            f"allowance {self.balance_s:+.2f} CPU s, a session start costs "
            f"{self.mean_start_s():.2f} CPU s)"
        )


FIT_MARGIN = 0.8  # one job more is let in only while the steady CPU is under this share


@dataclass
class JobsFit:
    """How many jobs `watch`'s CPU budget pays for. Each watched job costs a floor however
    low its rates go (its probes' ticks, its windows' analysis, py-spy's reads of its
    threads): 8 idle jobs beside hostile processes cost 0.14 cores against 0.10. When the
    steady CPU (session starts left out) is over `cores` for `hold_s`, as many jobs as
    their mean cost says go over it are to be dropped (the idle ones: the caller), and
    `fit` falls to what stays; when it is under FIT_MARGIN of `cores` for `hold_s` and jobs
    wait, one more fits, up to `most` (--max-jobs). One change per `hold_s`, so that each
    is measured before the next."""

    most: int
    cores: float
    hold_s: float = ALLOWANCE_S
    fit: int = 0
    changed_at: float = float("-inf")

    def __post_init__(self) -> None:
        self.fit = self.fit or self.most

    def over(self, now: float, steady: float | None, jobs: int) -> int:
        """How many of `jobs` to drop now for a steady CPU of `steady` cores (0: none)."""
        if steady is None or now - self.changed_at < self.hold_s or jobs <= 1:
            return 0
        if steady <= self.cores:
            return 0
        per_job = steady / jobs
        return min(jobs - 1, max(1, math.ceil((steady - self.cores) / per_job - 1e-9)))

    def dropped(self, now: float, jobs: int) -> None:
        """`jobs` stay after a drop: no more than them fit until the CPU says so."""
        self.fit, self.changed_at = max(1, min(self.most, jobs)), now

    def grow(self, now: float, steady: float | None, jobs: int, waiting: bool) -> bool:
        """One more job fits (True) when jobs wait, every place is taken and the steady CPU
        has been under FIT_MARGIN of the budget for `hold_s`."""
        if steady is None or now - self.changed_at < self.hold_s or self.fit >= self.most:
            return False
        if waiting and jobs >= self.fit and steady < self.cores * FIT_MARGIN:
            self.fit, self.changed_at = self.fit + 1, now
            return True
        return False
