"""What the CPU attains for the job's own sizes: a short calibration run by the agent (never in
the job), on the shape of the job's largest matrix product the hooks reported: a GEMM in the
job's dtype and a copy of its output's size, each timed in bursts of a few milliseconds, the
best burst kept. Run once per shape, again after CALIB_AGAIN_S (on a busy box the best of
several is nearer what the device attains). Needs torch in gpudiag's environment; without it
nothing is sampled and the analysis says the attainable rate is not known."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpudiag.probes.base import Sample, now_ns

BURST_S = 0.004  # one timed burst
BURSTS = 3
CALIB_AGAIN_S = 20.0
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


class Calibrator:
    """Calibrates each new shape the hooks report (a gemm sample on a CPU), and again now and
    then."""

    def __init__(self) -> None:
        self.done: dict[tuple, float] = {}

    def on_samples(self, got: list[Sample]) -> list[Sample]:
        out: list[Sample] = []
        for s in got:
            if s.labels.get("kind") != "gemm" or s.labels.get("device") != "cpu":
                continue
            shape = (s.values.get("gemm_m"), s.values.get("gemm_k"), s.values.get("gemm_n"))
            if any(v is None for v in shape):
                continue
            key = (s.labels.get("dtype"), *shape)
            now = time.monotonic()
            if key in self.done and now - self.done[key] < CALIB_AGAIN_S:
                continue
            self.done[key] = now
            m, k, n = (int(v or 1) for v in shape)
            out += calibrate(str(s.labels.get("dtype")), m, k, n, s.t_ns)
        return out
