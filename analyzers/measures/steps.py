"""Long steps in the hooks' step timing: the steps that carry a periodic pause (an evaluation
pass, the DataLoader's workers started again at an epoch's start), how many and how long."""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analyzers.timeline.timeline import Aggregate

# A step this many times the median step carries a pause of its own (the step's work varies
# far less: the planted and public loops' p95 is within 1.5x of their median).
LONG_STEP_FACTOR = 3.0
MIN_STEPS = 10


@dataclass(frozen=True)
class LongSteps:
    """The steps the hooks timed and the long ones among them."""

    steps: int
    long: int  # steps over LONG_STEP_FACTOR times the median
    median_s: float
    excess_s: float  # the long steps' time beyond the median
    total_s: float  # every timed step's time

    @property
    def every(self) -> float | None:
        """Steps per long step (None without long steps)."""
        return self.steps / self.long if self.long else None

    @property
    def pause_s(self) -> float:
        """Mean pause of a long step beyond a median step."""
        return self.excess_s / self.long if self.long else 0.0

    @property
    def share(self) -> float:
        """Share of the timed steps' time the pauses take."""
        return self.excess_s / self.total_s if self.total_s > 0 else 0.0


def long_steps(tl: Aggregate, factor: float = LONG_STEP_FACTOR) -> LongSteps | None:
    """The long steps of the hooks' step timing; None with fewer than MIN_STEPS timed."""
    r = tl.rollup("hooks", "step_time_s", kind="step")
    if r is None or r.count < MIN_STEPS or not r.buckets:
        return None
    median = r.quantile(0.5)
    if not median or median <= 0:
        return None
    long = 0
    excess = 0.0
    for value, n in r.histogram():
        if value > factor * median:
            long += n
            excess += n * (value - median)
    return LongSteps(r.count, long, median, excess, r.total)
