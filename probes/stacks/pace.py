"""Pacing the stack probe below its lowest rates: py-spy reads every thread of the job at
every tick, so a job with many threads (1,500 idle ones) costs more at the lowest rate
(1 Hz) than its share of a budget. Each window's py-spy CPU is measured; when it is over the
probe's CPU goal at the lowest rates, the probe rests after the window for as long as that
window's cost buys at the goal, so that its cost over windows and rests stays at the goal
however many threads the job has. A rest longer than `max_rest_s` is not worth waiting for
(the job's recent findings would have no stacks): sampling then stops, until the job's
threads fall to what one window per `max_rest_s` affords at the goal (looked at every
`recheck_s`)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_REST_S = 300.0  # the longest rest between two windows; past it stack sampling stops
RECHECK_S = 30.0  # while stopped, how often the job's thread count is looked at


@dataclass
class Pace:
    """The stack probe's rests between windows (see the module docstring)."""

    max_rest_s: float = MAX_REST_S
    recheck_s: float = RECHECK_S
    rest_s: float = 0.0  # the rest after the last window
    stopped: bool = False
    threads: int = 0  # threads of the loop process read per tick, at the last window
    window_cpu_s: float = 0.0  # py-spy's CPU in the last window measured at the lowest rates
    window_s: float = 0.0  # that window's length
    cpu_goal: float = 0.0  # the goal (cores) the last decision was made at
    sampled_s: float = 0.0  # seconds recorded ...
    rested_s: float = 0.0  # ... and rested (or stopped), for the share sampled

    @property
    def paced(self) -> bool:
        """True while it rests between windows or is stopped: the lowest rates cost more than
        its goal (the governor then never raises them)."""
        return self.stopped or self.rest_s > 0.0

    def affordable_threads(self, goal: float | None = None) -> int:
        """Threads read per tick that one window per `max_rest_s` affords at `goal` (py-spy's
        cost per window grows with the threads it reads), from the last measured window."""
        g = self.cpu_goal if goal is None else goal
        if self.window_cpu_s <= 0.0 or self.threads <= 0:
            return 0
        per_thread = self.window_cpu_s / self.threads
        return int(g * (self.window_s + self.max_rest_s) / per_thread)

    def after_window(
        self, cpu_s: float, window_s: float, threads: int, goal: float | None, lowest: bool
    ) -> str | None:
        """Decide the rest after a window that cost `cpu_s` of py-spy CPU over `window_s`
        reading `threads` threads per tick, at the goal `goal` (cores; None: no goal) and
        at the lowest rates or not; a line for the log when the pacing changed, else None."""
        was = self.paced
        self.threads, self.sampled_s = threads, self.sampled_s + window_s
        if goal is None or goal <= 0.0 or not lowest or window_s <= 0.0:
            self.rest_s = 0.0
            return self._said(was)
        self.window_cpu_s, self.window_s, self.cpu_goal = cpu_s, window_s, goal
        rest = cpu_s / goal - window_s
        if rest > self.max_rest_s:
            self.stopped, self.rest_s = True, 0.0
            return self.stop_line()
        self.rest_s = max(0.0, rest)
        return self._said(was)

    def _said(self, was: bool) -> str | None:
        if self.rest_s > 0.0 and not was:
            return self.rest_line()
        if was and not self.paced:
            return f"stack sampling back to its rates ({self.threads} threads read per tick)"
        return None

    def rested(self, seconds: float) -> None:
        """Count seconds spent resting or stopped."""
        self.rested_s += max(0.0, seconds)

    def may_resume(self, threads: int, goal: float | None) -> bool:
        """While stopped: whether the job's `threads` now fit one window per `max_rest_s` at
        `goal` (its share may have grown: fewer jobs share the budget)."""
        if not self.stopped or goal is None:
            return not self.stopped or goal is None
        if threads <= self.affordable_threads(goal):
            self.stopped = False
            return True
        return False

    def duty(self) -> float:
        """The share of the time it records now: 1 at its rates, below 1 while it rests
        between windows, 0 while stopped."""
        if self.stopped:
            return 0.0
        return self.window_s / (self.window_s + self.rest_s) if self.rest_s > 0 else 1.0

    def share(self) -> float:
        """The share of the time the stacks were recorded (1.0 before any rest)."""
        total = self.sampled_s + self.rested_s
        return self.sampled_s / total if total > 0 else 1.0

    def _cost(self) -> str:
        return (
            f"py-spy reads {self.threads} threads per tick; a window at the lowest rates cost "
            f"{self.window_cpu_s:.2f} CPU s over {self.window_s:.0f} s, more than its share of "
            f"the CPU budget ({self.cpu_goal:.4f} cores for py-spy)"
        )

    def rest_line(self) -> str:
        """Why the stacks rest between windows, with units."""
        every = self.window_s + self.rest_s
        return (
            f"stack sampling paced: {self._cost()}, so one window every {every:.0f} s "
            f"({self.window_s / every:.0%} of the time)"
        )

    def stop_line(self) -> str:
        """Why stack sampling stopped, with units, and when it comes back."""
        return (
            f"stack sampling stopped: {self._cost()}, which would buy one window every "
            f"{self.window_cpu_s / self.cpu_goal:.0f} s, longer than {self.max_rest_s:.0f} s; "
            f"it resumes when the job has at most {self.affordable_threads()} threads"
        )
