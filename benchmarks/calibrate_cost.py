"""What the agent's CPU calibration child costs the job, and what it measures, niced or not.

The job: a training loop in this process using every core (torch's default threads: both
cores on a 2-core box). In interleaved rounds of WINDOW seconds each, the job runs bare, then
with a calibration child started at the window's start (`python -m
gpudiag.probes.inprocess.calibrate --nice N`, at the job's largest product's shape) for each
N in --nice; the order of the arms turns each round. Per arm: the job's steps/s and its cost
against the bare window of the same round (bare / with), the child's wall time and the gemm
rate it measured. Before the rounds one child runs with the job idle: the rate the CPU attains
(what a calibration on a busy box should come near).

    python benchmarks/calibrate_cost.py [--window 8] [--rounds 3] [--nice 0 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

SHAPE = ["float32", 128, 512, 512, 0]


def child(nice: int) -> subprocess.Popen:
    """A calibration child at niceness +`nice`, given the shape."""
    cmd = [sys.executable, "-m", "gpudiag.probes.inprocess.calibrate", "--nice", str(nice)]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdin is not None
    p.stdin.write(json.dumps([SHAPE]))
    p.stdin.close()
    return p


def gemm_rate(p: subprocess.Popen) -> float:
    """The child's gemm FLOP/s (0: none)."""
    out = p.stdout.read() if p.stdout is not None else ""
    try:
        return float(json.loads(out.strip().splitlines()[-1])["samples"][0][1])
    except (ValueError, IndexError, KeyError):
        return 0.0


def window(model, opt, x, y, seconds: float, nice: int | None) -> tuple[float, float, float]:
    """Steps/s of the job over `seconds`, with a child at `nice` (None: bare) started at its
    start: (steps/s, the child's wall time, its gemm rate); a child still running at the
    window's end is waited for (its time then the window's and more)."""
    p = child(nice) if nice is not None else None
    t0, n, done_at = time.perf_counter(), 0, None
    while time.perf_counter() - t0 < seconds:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
        if p is not None and done_at is None and p.poll() is not None:
            done_at = time.perf_counter()
    sps = n / (time.perf_counter() - t0)
    if p is None:
        return sps, 0.0, 0.0
    p.wait()
    took = (done_at or time.perf_counter()) - t0
    return sps, took, gemm_rate(p)


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nice", type=int, nargs="+", default=[0, 10])
    a = ap.parse_args()
    model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(4)])
    model.append(nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(128, 512), torch.randint(0, 10, (128,))
    print(f"job: {torch.get_num_threads()} torch threads; load {load()}")
    idle = child(0)
    idle.wait()
    print(f"the job idle: the child measured {gemm_rate(idle) / 1e9:.2f} GFLOP/s")
    arms: list[int | None] = [None, *a.nice]
    cost: dict[int, list[float]] = {n: [] for n in a.nice}
    rates: dict[int, list[float]] = {n: [] for n in a.nice}
    took: dict[int, list[float]] = {n: [] for n in a.nice}
    for r in range(a.rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        got = {nice: window(model, opt, x, y, a.window, nice) for nice in order}
        bare = got[None][0]
        parts = [f"bare {bare:.2f} steps/s"]
        for nice in a.nice:
            sps, t, g = got[nice]
            cost[nice].append(bare / sps)
            rates[nice].append(g)
            took[nice].append(t)
            parts.append(
                f"nice {nice}: {sps:.2f} steps/s x{bare / sps:.3f}, child {t:.1f} s "
                f"{g / 1e9:.2f} GFLOP/s"
            )
        print(f"round {r} (load {load()}): " + "; ".join(parts))
    for nice in a.nice:
        best, med = max(rates[nice]) / 1e9, statistics.median(rates[nice]) / 1e9
        print(
            f"nice {nice}: median job cost x{statistics.median(cost[nice]):.3f} over a "
            f"{a.window:.0f} s window, child {statistics.median(took[nice]):.1f} s, best rate "
            f"{best:.2f} GFLOP/s (median {med:.2f})"
        )
    print(f"load {load()}")


if __name__ == "__main__":
    main()
