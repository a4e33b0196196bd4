"""What the CPU attains for the job's own sizes: a short calibration run by the agent (never in
the job), on the shape of the job's largest matrix product the hooks reported: a GEMM in the
job's dtype and a copy of its output's size, each timed in bursts of a few milliseconds, the
best burst kept. Run once per shape, again after CALIB_AGAIN_S (on a busy box the best of
several is nearer what the device attains), at most MAX_RUNS times a shape. Needs torch in
gpudiag's environment; without it nothing is sampled and the analysis says the attainable rate
is not known.

It runs in a child process that exits when done (`python -m gpudiag.probes.inprocess.calibrate`):
importing torch holds about 200 MB resident for the rest of the process (the agent's own memory
went from 46 to 242 MB at its first calibration and stayed there, over its 150 MB budget), for a
calibration of a few milliseconds. The child's CPU time (the import, about 1.5 s) and its peak
memory are the agent's: the hooks probe reports them to the budget governor. It runs from a
thread of its own, beside the hooks probe's drain (`Calibrator.on_samples`), starts only on a
counted step's shape, so never before the job's steps (WARMUP_STEPS, then a counted one), and
at niceness +NICE: its import yields to the job's threads."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpudiag.probes.base import Sample, now_ns
from gpudiag.probes.spawn import run_process

BURST_S = 0.004  # one timed burst
BURSTS = 3
CALIB_AGAIN_S = 60.0  # a shape calibrated again after this (each child imports torch again)
MAX_RUNS = 4  # children a shape gets in a run: the best rate so far stands after
ROUNDS = 3  # rounds of bursts in one child, ROUND_GAP_S apart: the best kept
ROUND_GAP_S = 0.3
CHILD_TIMEOUT_S = 60.0
# the child's niceness raised by this: beside a job of two torch threads on 2 cores (load
# 1.4-2.2, benchmarks/calibrate_cost.py) a child at +0 cost the job x1.29 over 10 s (its
# threads work in lockstep: one preempted holds the other up) and measured 92-95 GFLOP/s;
# at +10, x1.07 and 99 GFLOP/s (the job idle: 99.5), in 11.5 s instead of 3.7
NICE = 10
MAX_ELEMS = 1 << 24  # a bigger product is calibrated on its first rows
DTYPES = ("float32", "float64", "bfloat16", "float16")


def _burst(fn: Callable[[], object], work: float) -> float:
    """The rate (work per second) of `fn` run for about BURST_S."""
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        took = time.perf_counter() - t0
        if took >= BURST_S:
            return n * work / took


def calibrate(dtype: str, m: int, k: int, n: int, t: int | None = None) -> list[Sample]:
    """Samples of the CPU's GEMM rate (FLOP/s) and copy bandwidth (B/s) at these sizes; empty
    when torch is not importable here or the dtype is not one calibrated. `t`: the samples'
    time (the shape's: importing torch here can take seconds on a busy box)."""
    if dtype not in DTYPES:
        return []
    try:
        import torch
    except Exception:  # noqa: BLE001 (gpudiag's environment without torch)
        return []
    rows = max(1, min(m, MAX_ELEMS // max(k, n, 1)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: a pool's barriers on a busy box measure the box
    try:
        return _calibrate(torch, dtype, rows, k, n, t)
    finally:
        torch.set_num_threads(threads)


def _calibrate(torch: Any, dtype: str, rows: int, k: int, n: int, t: int | None) -> list[Sample]:
    dt = getattr(torch, dtype)
    a = torch.randn(rows, k).to(dt)
    b = torch.randn(k, n).to(dt)
    out = torch.empty(rows, n, dtype=dt)
    src = torch.randn(rows, n).to(dt)
    dst = torch.empty_like(src)
    torch.mm(a, b, out=out)  # warm: the first call allocates and picks its kernel
    gemm = max(_burst(lambda: torch.mm(a, b, out=out), 2.0 * rows * k * n) for _ in range(BURSTS))
    nbytes = 2.0 * src.numel() * src.element_size()
    copy = max(_burst(lambda: dst.copy_(src), nbytes) for _ in range(BURSTS))
    t = now_ns() if t is None else t
    labels = {"kind": "calibration", "dtype": dtype, "device": "cpu"}
    return [
        Sample("hooks", t, {**labels, "op": "gemm"}, {"calib_rate": gemm}),
        Sample("hooks", t, {**labels, "op": "copy"}, {"calib_rate": copy}),
    ]


def _child_main(argv: list[str]) -> int:
    """The child: shapes [[dtype, m, k, n, t], ...] on stdin; on stdout {"samples": [[dtype, gemm
    FLOP/s, copy B/s, t], ...], "cpu_s": its CPU time, "peak_rss": its own peak memory, "nice":
    its niceness}. `--nice N`: its niceness raised by N first (its torch import yields to the
    job)."""
    if len(argv) == 2 and argv[0] == "--nice" and argv[1].isdigit() and int(argv[1]):
        try:
            os.nice(int(argv[1]))
        except OSError:
            pass
    out = []
    for dtype, m, k, n, t in json.loads(sys.stdin.read() or "[]"):
        best: dict[str, float] = {}
        for r in range(ROUNDS):
            if r:
                time.sleep(ROUND_GAP_S)
            for smp in calibrate(str(dtype), int(m), int(k), int(n), int(t)):
                op = smp.labels["op"]
                best[op] = max(best.get(op, 0.0), smp.values.get("calib_rate") or 0.0)
        if best:
            out.append([dtype, best.get("gemm", 0.0), best.get("copy", 0.0), int(t)])
    doc = {
        "samples": out,
        "cpu_s": time.process_time(),
        "peak_rss": _own_peak(),
        "nice": os.nice(0),
    }
    print(json.dumps(doc))
    return 0


def _own_peak() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _samples(rows: Any) -> list[Sample]:
    """The child's rows as the hooks probe's calibration samples (malformed rows dropped)."""
    out: list[Sample] = []
    for row in rows if isinstance(rows, list) else []:
        try:
            dtype, gemm, copy, t = str(row[0]), float(row[1]), float(row[2]), int(row[3])
        except (TypeError, ValueError, IndexError):
            continue
        labels = {"kind": "calibration", "dtype": dtype, "device": "cpu"}
        for op, rate in (("gemm", gemm), ("copy", copy)):
            if rate > 0:
                out.append(Sample("hooks", t, {**labels, "op": op}, {"calib_rate": rate}))
    return out


class Calibrator:
    """Calibrates each new shape the hooks report (a gemm sample on a CPU), and again now and
    then, in a child process (see the module's docstring)."""

    def __init__(self, python: str | None = None, nice: int = NICE) -> None:
        self.python = python or sys.executable
        self.nice = nice
        self.done: dict[tuple, tuple[float, int]] = {}  # shape -> (last run, runs)
        self.spent_s = 0.0  # CPU seconds of the children so far
        self.runs = 0
        self._peak = 0  # the peak memory of a child since the governor last read it
        self._lock = threading.Lock()
        self._queued: list[list] = []  # shapes due while a child runs: the next child's
        self._ready: list[Sample] = []  # finished children's samples, not yet taken
        self._thread: threading.Thread | None = None

    def due(self, got: list[Sample]) -> list[list]:
        """The shapes of these samples to calibrate now: [dtype, m, k, n, t] each."""
        out: list[list] = []
        for s in got:
            if s.labels.get("kind") != "gemm" or s.labels.get("device") != "cpu":
                continue
            if s.labels.get("dtype") not in DTYPES:
                continue
            shape = (s.values.get("gemm_m"), s.values.get("gemm_k"), s.values.get("gemm_n"))
            if any(v is None for v in shape):
                continue
            key = (s.labels.get("dtype"), *shape)
            now = time.monotonic()
            last, runs = self.done.get(key, (None, 0))
            if runs >= MAX_RUNS or (last is not None and now - last < CALIB_AGAIN_S):
                continue
            self.done[key] = (now, runs + 1)
            m, k, n = (int(v or 1) for v in shape)
            out.append([s.labels.get("dtype"), m, k, n, s.t_ns])
        return out

    def on_samples(self, got: list[Sample]) -> list[Sample]:
        """Start a child for the shapes in `got` that are due, in a thread of its own (the
        hooks probe keeps draining the job's datagrams meanwhile: at load 5 a child importing
        torch took seconds, the job's queue filled and a starved loader's run read 17 steps of
        its 40); the samples of the children finished since the last call."""
        shapes = self.due(got)
        if shapes:
            with self._lock:
                self._queued += shapes
            self._start()
        return self.take()

    def _start(self) -> None:
        """A child for the queued shapes, unless one runs (it starts the next when done)."""
        with self._lock:
            if not self._queued or (self._thread is not None and self._thread.is_alive()):
                return
            shapes, self._queued = self._queued, []
            self._thread = threading.Thread(
                target=self._work, args=(shapes,), name="gpudiag-calibrate", daemon=True
            )
            self._thread.start()

    def _work(self, shapes: list[list]) -> None:
        got: list[Sample] = []
        try:
            got = self.run(shapes)
        finally:  # (a child's answer that raised left the thread set: join() spun to its end)
            with self._lock:
                self._ready += got
                self._thread = None
        self._start()

    def take(self) -> list[Sample]:
        """The samples of the children finished since the last call."""
        with self._lock:
            out, self._ready = self._ready, []
        return out

    def join(self, timeout: float | None = None) -> None:
        """Wait for the child in flight (and the one it starts) to finish: tests, the end."""
        end = None if timeout is None else time.monotonic() + timeout
        while (t := self._thread) is not None:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
            if end is not None and time.monotonic() >= end:
                return

    def run(self, shapes: list[list]) -> list[Sample]:
        """One child for these shapes; its samples (none when it fails or takes too long)."""
        cmd = [self.python, "-m", "gpudiag.probes.inprocess.calibrate", "--nice", str(self.nice)]
        try:
            res = run_process(
                cmd,
                input=json.dumps(shapes),
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT_S,
            )
            doc = json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {}
        except (OSError, subprocess.SubprocessError, ValueError):
            return []
        if not isinstance(doc, dict):
            return []
        try:  # the child's answer is data: a bad number is dropped, never raised
            cpu, peak = float(doc.get("cpu_s") or 0.0), int(doc.get("peak_rss") or 0)
        except (TypeError, ValueError, OverflowError):
            cpu, peak = 0.0, 0
        with self._lock:
            self.runs += 1
            self.spent_s += max(0.0, cpu) if math.isfinite(cpu) else 0.0
            self._peak = max(self._peak, peak)
        return _samples(doc.get("samples"))

    def cpu_s(self) -> float:
        """CPU seconds the calibration children have used."""
        return self.spent_s

    def take_peak_rss(self) -> int:
        """The peak memory of the children since the last call (the governor's period)."""
        with self._lock:
            peak, self._peak = self._peak, 0
        return peak


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
