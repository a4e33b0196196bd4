"""The compute sampler's cost to the job (issue 55: at most 1%): the same training loop with
gpudiag_compute's Sampler called after every optimizer step (its defaults: a timed step every
2 s, a counted one every 30 s) against without it, in interleaved rounds of the same length,
one process; prints the steps/s ratio (off / on) per round and the median.

    python benchmarks/compute_hooks_overhead.py [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from gpudiag.probes.inject import gpudiag_compute as gc


def rate(model, opt, sampler, seconds: float) -> float:
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    t0, n = time.perf_counter(), 0
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
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(6)])
    model.append(nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    ratios = []
    for r in range(a.rounds):
        sampler = gc.Sampler(torch, [model])
        off = rate(model, opt, None, a.seconds)
        on = rate(model, opt, sampler, a.seconds)
        ratios.append(off / on)
        print(f"round {r}: off {off:.1f} steps/s, on {on:.1f} steps/s, cost x{off / on:.4f}")
    print(f"median cost x{statistics.median(ratios):.4f} (1.01 = 1%)")


if __name__ == "__main__":
    main()
