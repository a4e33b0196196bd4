"""The timeline's building blocks: running statistics of one series (`Rollup`), which
stacks (`ThreadKey`), py-spy window totals (`WindowTotals`), and the segment length rule."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Series whose distribution (percentiles) is kept, in log buckets 2% wide: bounded memory.
DISTRIBUTIONS = frozenset({"step_time_s", "forward_time_s", "forward_batch", "request_latency_s"})
_LOG_STEP = math.log(1.02)


def segment_width_ns(elapsed_ns: int, base_ns: int, max_segments: int) -> int:
    """The segment length a timeline with no gaps has after `elapsed_ns`: the base length,
    doubled until the run fits in `max_segments` segments."""
    width = base_ns
    while elapsed_ns // width + 1 > max_segments:
        width *= 2
    return width


@dataclass(slots=True)
class Rollup:
    """Running statistics of one series."""

    count: int = 0
    total: float = 0.0
    minimum: float = float("inf")
    maximum: float = float("-inf")
    last: float | None = None
    first_ns: int | None = None
    last_ns: int | None = None
    buckets: dict[int, int] | None = None

    def add(self, t_ns: int, value: float) -> None:
        """Fold one value in."""
        if self.buckets is not None and value > 0:
            b = math.floor(math.log(value) / _LOG_STEP)
            self.buckets[b] = self.buckets.get(b, 0) + 1
        self.count += 1
        self.total += value
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value
        if self.last_ns is None or t_ns >= self.last_ns:
            self.last, self.last_ns = value, t_ns
        if self.first_ns is None or t_ns < self.first_ns:
            self.first_ns = t_ns

    def merge(self, other: Rollup) -> None:
        """Fold another rollup of the same series in (the hot path of coarsening, windows
        and replay: comparisons rather than calls)."""
        if not other.count:
            return
        self.count += other.count
        self.total += other.total
        if other.minimum < self.minimum:
            self.minimum = other.minimum
        if other.maximum > self.maximum:
            self.maximum = other.maximum
        last_ns = other.last_ns
        if last_ns is not None and (self.last_ns is None or last_ns >= self.last_ns):
            self.last, self.last_ns = other.last, last_ns
        first_ns = other.first_ns
        if first_ns is not None and (self.first_ns is None or first_ns < self.first_ns):
            self.first_ns = first_ns
        if other.buckets:
            if self.buckets is None:
                self.buckets = {}
            for b, n in other.buckets.items():
                self.buckets[b] = self.buckets.get(b, 0) + n

    def copy(self) -> Rollup:
        """An independent copy."""
        r = Rollup()
        r.merge(self)
        if self.buckets is not None and r.buckets is None:
            r.buckets = {}
        return r

    @property
    def mean(self) -> float | None:
        """Mean of all values, None when there are none."""
        return self.total / self.count if self.count else None

    def histogram(self) -> list[tuple[float, int]]:
        """(value, count) of a distribution series' buckets, smallest first (within 2%)."""
        return [
            (min(self.maximum, max(self.minimum, math.exp((b + 0.5) * _LOG_STEP))), n)
            for b, n in sorted((self.buckets or {}).items())
        ]

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
    expected_ticks: float = 0.0  # what the requested rates would have recorded

    def merge(self, other: WindowTotals) -> None:
        """Fold another total in."""
        self.windows += other.windows
        self.expected_ticks += other.expected_ticks
        self.ticks += other.ticks
        self.duration_s += other.duration_s
        self.errors += other.errors
        self.rate_hz = other.rate_hz or self.rate_hz
