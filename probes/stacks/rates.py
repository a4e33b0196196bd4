"""The stack probe's sampling rates, which the budget governor turns: one level scales the
loop, GIL and worker rates and lengthens the windows; the probe reports what py-spy costs.

A mixin of StackProbe: it reads the probe's configured rates (rate_hz, gil_rate_hz,
worker_rate_hz, min_rate_hz, window_s), its target, its running recorders and its caches.
"""

from __future__ import annotations

import os
import subprocess
import threading

import psutil

from gpudiag.probes.base import Target
from gpudiag.probes.stacks.pace import Pace
from gpudiag.probes.stacks.pyspy import SPY_SAMPLE_BASE_S, SPY_SAMPLE_PER_THREAD_S, SPY_START_S
from gpudiag.probes.stacks.pyspy_output import SourceLines


def thread_count(pid: int) -> int:
    """Threads of a process now (0 when it is gone): what py-spy reads at each tick."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


class StackRates:
    """Rates and cost of the stack probe (see the module docstring)."""

    # set by StackProbe.__init__ (and open): what the rates and costs read
    rate_hz: int
    gil_rate_hz: int
    worker_rate_hz: int
    min_rate_hz: int
    window_s: float
    subprocesses: bool
    level: float
    target: Target | None
    lean: bool
    spy_cpu_s: float
    spy_window_rss: int
    pace: Pace | None
    _lock: threading.Lock
    _procs: list[subprocess.Popen]
    _sources: SourceLines

    def _workers(self) -> list[int]:
        raise NotImplementedError  # StackProbe's

    # ---- rates --------------------------------------------------------------------------
    def set_level(self, level: float) -> None:
        """Scale the sampling rates (1.0 = as configured); applies from the next window."""
        self.level = max(0.0, min(1.0, level))

    def rates(self) -> dict[str, float]:
        """The rates the next window will use; when paced (watch), the share of the time
        it records (1: always; 0: stopped) and the threads py-spy read per tick."""
        loop = max(self.min_rate_hz, round(self.rate_hz * self.level))
        gil = max(2, round(self.gil_rate_hz * self.level)) if self.gil_rate_hz > 0 else 0
        worker = (
            max(2, round(self.worker_rate_hz * self.level))
            if self.subprocesses and self.worker_rate_hz > 0
            else 0
        )
        out = {
            "stacks_loop_hz": float(loop),
            "stacks_gil_hz": float(gil),
            "stacks_worker_hz": float(worker),
            "stacks_window_s": self.window_now(),
        }
        if self.pace is not None:
            out["stacks_sampled_ratio"] = self.pace.duty()
            out["stacks_threads"] = float(self.pace.threads)
        return out

    def at_lowest(self) -> bool:
        """Whether the loop is sampled at its lowest rate (the budget can lower no further)."""
        return round(self.rate_hz * self.level) <= self.min_rate_hz

    def window_now(self) -> float:
        """The window length at the current level: starting py-spy costs about 10 ms of CPU,
        so below full rate windows grow (up to 10 s) and fewer recorders are started."""
        longest = max(self.window_s, 10.0)
        return round(min(longest, self.window_s / max(self.level, 0.01) ** 0.5), 1)

    def estimate_cost(self, level: float = 1.0) -> float:
        """First guess of py-spy's CPU (cores) at a level, from the target's thread count."""
        if self.target is None:
            return 0.0
        threads = thread_count(self.target.pid) or 1
        per_sample = SPY_SAMPLE_BASE_S + SPY_SAMPLE_PER_THREAD_S * threads
        loop = max(self.min_rate_hz, self.rate_hz * level)
        has_workers = self.subprocesses and bool(self._workers())
        workers = (
            self.worker_rate_hz * level * (SPY_SAMPLE_BASE_S + 2 * SPY_SAMPLE_PER_THREAD_S)
            if has_workers
            else 0.0
        )
        window = min(max(self.window_s, 10.0), self.window_s / max(level, 0.01) ** 0.5)
        starts = (2 + has_workers) * SPY_START_S / max(1.0, window)
        return loop * per_sample + workers + starts

    def cpu_s(self) -> float:
        """CPU seconds py-spy has used so far: finished recorders and the running ones."""
        with self._lock:
            total, running = self.spy_cpu_s, list(self._procs)
        for p in running:
            try:
                ct = psutil.Process(p.pid).cpu_times()
                total += ct.user + ct.system
            except psutil.Error:
                pass
        return total

    def child_rss_bytes(self) -> int:
        """Peak resident memory of py-spy in the last window (all recorders together)."""
        return self.spy_window_rss

    def shed_memory(self) -> None:
        """Over the memory budget: drop the source-line cache, and from now on run the GIL
        and the worker recorders in alternate windows (one py-spy fewer at a time)."""
        self._sources = SourceLines(self._sources.max_entries)
        self.lean = True
