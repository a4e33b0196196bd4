"""Time-bounded training for the public scripts: each script calls `clock.step()` once per
optimizer step and stops when it returns True. PUBLIC_SECONDS (default 30) bounds the
training time after the warm-up steps (so a slow start on a busy box still leaves a
measurement); at the end (or on SIGTERM/SIGINT) it prints `steps: N in S s`, the steps after
PUBLIC_WARMUP steps (default 3) and the time they took: the harness's throughput. With
PUBLIC_STEP_LOG set, the Unix time of every step is written there (JSON) at the end too: the
rate over any window of the run (benchmarks/attach_hooks_public.py)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time


class StepClock:
    """Counts steps and says when PUBLIC_SECONDS of training have passed."""

    def __init__(self) -> None:
        self.seconds = float(os.environ.get("PUBLIC_SECONDS", "30"))
        self.warmup = int(os.environ.get("PUBLIC_WARMUP", "3"))
        self.start = time.monotonic()
        self.t0: float | None = None
        self.n = 0
        self.done = False
        self.log_path = os.environ.get("PUBLIC_STEP_LOG")
        self.times: list[float] = []
        atexit.register(self.report)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.report()
        sys.exit(0)

    def step(self) -> bool:
        """Count one step; True once the time is up."""
        self.n += 1
        if self.log_path:
            self.times.append(time.time())
        now = time.monotonic()
        if self.n == self.warmup:
            self.t0 = now
        return self.t0 is not None and now - self.t0 >= self.seconds

    def report(self) -> None:
        """Print the steady-state step count and time once."""
        if self.done:
            return
        self.done = True
        if self.log_path:
            with open(self.log_path, "w") as f:
                json.dump(self.times, f)
        if self.t0 is None:
            print("steps: 0 in 0.000 s", flush=True)
            return
        print(f"steps: {self.n - self.warmup} in {time.monotonic() - self.t0:.3f} s", flush=True)


clock = StepClock()
