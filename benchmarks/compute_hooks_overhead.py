"""The compute sampler's cost to the job (issue 55: at most 1%): the same training loop with
gpudiag_compute's Sampler called after every optimizer step (its defaults: a timed step every
2 s; the first 2 armed steps counted, then one every 4 s or more, spaced so counting adds at
most 0.4% of the job's time) against without it, in interleaved rounds of the same length,
one process; a new Sampler each round (each round is a look's start, its counts included);
prints the steps/s ratio (off / on) per round, the median and the counted steps. On a busy
box a 1% cost is below the rounds' noise: `--paired` also times a plain step against an armed
one (timed, then counted) in alternation, and gives the cost at the defaults from the medians
of the pairs' differences (the timed step's extra over SAMPLE_EVERY_S, the counted one's over
its spacing; the look's first counts apart, as a one-off over a 10 s look).

    python benchmarks/compute_hooks_overhead.py [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from gpudiag.probes.inject import gpudiag_compute as gc


def rate(model, opt, sampler, seconds: float) -> tuple[float, float]:
    """Steps per wall second and per second of the loop thread's CPU time (one intra-op
    thread: the step's work is the thread's; on a busy box the wall rate also holds the
    waits for a CPU, the CPU rate does not)."""
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    t0, c0, n = time.perf_counter(), time.thread_time(), 0
    while time.perf_counter() - t0 < seconds:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sampler is not None:
            sampler.note_optimizer(opt)
            sampler.on_step()
            sampler.take()
        n += 1
    return n / (time.perf_counter() - t0), n / (time.thread_time() - c0)


def step(model, opt, x, y) -> None:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def paired_extra(model, opt, counting: bool, pairs: int) -> float:
    """The median over `pairs` of an armed step's wall time less the plain step's before it."""
    sampler = gc.Sampler(torch, [model])
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    diffs = []
    for _ in range(pairs):
        t0 = time.perf_counter()
        step(model, opt, x, y)
        t1 = time.perf_counter()
        sampler._arm(counting)
        step(model, opt, x, y)
        sampler.note_optimizer(opt)
        sampler._finish()
        sampler.take()
        diffs.append((time.perf_counter() - t1) - (t1 - t0))
    return statistics.median(diffs)


def paired(model, opt, pairs: int) -> None:
    timed = paired_extra(model, opt, False, pairs)
    counted = paired_extra(model, opt, True, max(10, pairs // 4))
    every = max(gc.COUNT_MIN_S, max(0.0, counted) / gc.COUNT_BUDGET)
    steady = timed / gc.SAMPLE_EVERY_S + counted / every
    print(
        f"paired: a timed step +{timed * 1e3:.3f} ms, a counted step +{counted * 1e3:.2f} ms;"
        f" counted every {every:.1f} s: steady cost {steady:.3%} of the job's time; the "
        f"look's first {gc.COUNT_FIRST} counts {gc.COUNT_FIRST * counted / 10:.2%} of a 10 s look"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--paired", type=int, default=0, help="pairs of plain and armed steps")
    a = p.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(6)])
    model.append(nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    if a.paired:
        paired(model, opt, a.paired)
    ratios, cpu = [], []
    for r in range(a.rounds):
        sampler = gc.Sampler(torch, [model])
        off, off_cpu = rate(model, opt, None, a.seconds)
        on, on_cpu = rate(model, opt, sampler, a.seconds)
        ratios.append(off / on)
        cpu.append(off_cpu / on_cpu)
        print(
            f"round {r}: off {off:.1f} steps/s, on {on:.1f} steps/s, cost x{off / on:.4f}; "
            f"per CPU second: off {off_cpu:.1f}, on {on_cpu:.1f}, cost x{off_cpu / on_cpu:.4f}"
            f" ({sampler.counted} counted steps)"
        )
    print(
        f"median cost x{statistics.median(ratios):.4f} wall, x{statistics.median(cpu):.4f} "
        "CPU time (1.01 = 1%)"
    )


if __name__ == "__main__":
    main()
