"""The timeline: bounded rollups of every series a run produced.

Memory does not grow with run length: each numeric series keeps a fixed set of running
statistics plus a short ring of recent points; stack counts are aggregated per thread with a
cap on distinct stacks and threads. The same samples in the same order give the same
timeline, so a live run and its replayed recording give the same findings.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from gpudiag.probes.base import Sample

LabelKey = tuple[tuple[str, str], ...]
OTHER_STACKS = "(other stacks)"
# Series whose distribution (percentiles) is kept, in log buckets 2% wide: bounded memory.
DISTRIBUTIONS = frozenset({"step_time_s"})
_LOG_STEP = math.log(1.02)


@dataclass
class Rollup:
    """Running statistics of one series and its most recent points."""

    count: int = 0
    total: float = 0.0
    minimum: float = float("inf")
    maximum: float = float("-inf")
    last: float | None = None
    recent: deque = field(default_factory=lambda: deque(maxlen=120))
    buckets: dict[int, int] | None = None

    def add(self, t_ns: int, value: float) -> None:
        """Fold one value in."""
        if self.buckets is not None and value > 0:
            b = math.floor(math.log(value) / _LOG_STEP)
            self.buckets[b] = self.buckets.get(b, 0) + 1
        self.count += 1
        self.total += value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)
        self.last = value
        self.recent.append((t_ns, value))

    @property
    def mean(self) -> float | None:
        """Mean of all values, None when there are none."""
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Approximate quantile (within 2%) of a distribution series; None otherwise."""
        if not self.buckets:
            return None
        n = sum(self.buckets.values())
        rank = q * (n - 1)
        seen = 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen > rank:
                return min(self.maximum, max(self.minimum, math.exp((b + 0.5) * _LOG_STEP)))
        return self.maximum


@dataclass(frozen=True)
class ThreadKey:
    """Which stacks: sampling mode, process role, thread id (0 for workers) and name."""

    mode: str
    role: str
    tid: int
    thread: str


@dataclass
class WindowTotals:
    """Totals over py-spy windows of one mode."""

    windows: int = 0
    ticks: float = 0.0
    duration_s: float = 0.0
    errors: float = 0.0
    rate_hz: float = 0.0


class Timeline:
    """Bounded aggregate of samples: series rollups, stack counts and call episodes."""

    def __init__(self, recent_points: int = 120, max_series: int = 4000,
                 max_threads: int = 256, max_stacks_per_thread: int = 4000,
                 skip_steps: int = 0) -> None:
        self.skip_steps = skip_steps  # warm-up: the hooks' first steps are left out
        self.recent_points = recent_points
        self.max_series = max_series
        self.max_threads = max_threads
        self.max_stacks_per_thread = max_stacks_per_thread
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.series: dict[tuple[str, str, LabelKey], Rollup] = {}
        self.stacks: dict[ThreadKey, dict[tuple[str, str], float]] = {}
        self.episodes: dict[tuple[int, str, str], list[float]] = {}
        self.windows: dict[str, WindowTotals] = {}
        self.worker_pids: set[int] = set()
        self.dropped = 0
        self.samples_seen = 0

    # ---- ingest -------------------------------------------------------------------------
    def add(self, sample: Sample) -> None:
        """Fold one sample in."""
        self.samples_seen += 1
        t = sample.t_ns
        self.start_ns = t if self.start_ns is None else min(self.start_ns, t)
        self.end_ns = t if self.end_ns is None else max(self.end_ns, t)
        if sample.probe == "stacks":
            self._add_stack(sample)
            return
        if self.skip_steps and sample.probe == "hooks" and sample.labels.get("kind") == "step":
            self.skip_steps -= 1
            return
        lk = tuple(sorted(sample.labels.items()))
        for name, value in sample.values.items():
            if value is None:
                continue
            key = (sample.probe, name, lk)
            roll = self.series.get(key)
            if roll is None:
                if len(self.series) >= self.max_series:
                    self.dropped += 1
                    continue
                roll = self.series[key] = Rollup(recent=deque(maxlen=self.recent_points),
                                                 buckets={} if name in DISTRIBUTIONS else None)
            roll.add(t, float(value))

    def extend(self, samples: list[Sample]) -> None:
        """Fold many samples in, in order."""
        for s in samples:
            self.add(s)

    def _add_stack(self, s: Sample) -> None:
        lab = s.labels
        kind = lab.get("kind", "stack")
        mode = lab.get("mode", "all")
        if kind == "window":
            w = self.windows.setdefault(mode, WindowTotals())
            w.windows += 1
            w.ticks += s.values.get("ticks") or 0.0
            w.duration_s += s.values.get("duration_s") or 0.0
            w.errors += s.values.get("errors") or 0.0
            w.rate_hz = s.values.get("rate_hz") or w.rate_hz
            return
        if kind == "episode":
            key = (int(lab.get("tid", "0")), lab.get("thread", ""), lab.get("anchor", ""))
            ep = self.episodes.get(key)
            if ep is None:
                if len(self.episodes) >= self.max_stacks_per_thread:
                    self.dropped += 1
                    return
                ep = self.episodes[key] = [0.0, 0.0]
            ep[0] += s.values.get("episodes") or 0.0
            ep[1] += s.values.get("count") or 0.0
            return
        role = lab.get("role", "target")
        if role == "worker":
            pid = int(lab.get("pid", "0"))
            if pid not in self.worker_pids and len(self.worker_pids) < 4096:
                self.worker_pids.add(pid)
            tkey = ThreadKey(mode, role, 0, lab.get("thread", ""))
        else:
            tkey = ThreadKey(mode, role, int(lab.get("tid", "0")), lab.get("thread", ""))
        table = self.stacks.get(tkey)
        if table is None:
            if len(self.stacks) >= self.max_threads:
                tkey = ThreadKey(mode, role, 0, "(other threads)")
                table = self.stacks.setdefault(tkey, {})
            else:
                table = self.stacks[tkey] = {}
        skey = (lab.get("stack", ""), lab.get("code", ""))
        if skey not in table and len(table) >= self.max_stacks_per_thread:
            skey = (OTHER_STACKS, "")
        table[skey] = table.get(skey, 0.0) + (s.values.get("count") or 0.0)

    # ---- queries ------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        """Seconds between the first and the last sample."""
        if self.start_ns is None or self.end_ns is None:
            return 0.0
        return (self.end_ns - self.start_ns) / 1e9

    def rollup(self, probe: str, name: str, **labels: str) -> Rollup | None:
        """The rollup of one series, labels matched exactly."""
        return self.series.get((probe, name, tuple(sorted(labels.items()))))

    def mean(self, probe: str, name: str, **labels: str) -> float | None:
        """Mean of one series, or None when it was never sampled."""
        r = self.rollup(probe, name, **labels)
        return r.mean if r else None

    def maximum(self, probe: str, name: str, **labels: str) -> float | None:
        """Maximum of one series, or None when it was never sampled."""
        r = self.rollup(probe, name, **labels)
        return r.maximum if r and r.count else None

    def matching(self, probe: str, name: str, **labels: str) -> list[tuple[dict, Rollup]]:
        """Every series of a field whose labels include the given ones."""
        out = []
        for (p, n, lk), r in self.series.items():
            if p != probe or n != name:
                continue
            d = dict(lk)
            if all(d.get(k) == v for k, v in labels.items()):
                out.append((d, r))
        return out

    def threads(self, mode: str = "all", role: str = "target") -> list[ThreadKey]:
        """The threads with stacks in one mode and role."""
        return [k for k in self.stacks if k.mode == mode and k.role == role]
