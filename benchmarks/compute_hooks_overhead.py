"""The compute sampler's cost to the job (issue 55: at most 1%): the same training loop with
gpudiag_compute's Sampler called after every optimizer step (its defaults: a timed step every
2 s; the first 2 armed steps counted, then one every 4 s or more, spaced so counting adds at
most 0.4% of the job's time) against without it, in interleaved rounds of the same length,
one process (the order turns each round); a new Sampler each round (each round is a look's
start, its counts included); prints the steps/s ratio (off / on) per round, the median and
the counted steps. On a busy box a 1% cost is below the rounds' noise: `--paired` also
times a plain step against an armed one (timed, then counted) in alternation, and gives the
cost at the defaults from the medians of the pairs' differences (the timed step's extra over
SAMPLE_EVERY_S, the counted one's over its spacing; the look's first counts apart, as a
one-off over a 10 s look).

The default model (`--model attn`) exercises everything a timed step reads: 4 blocks of causal
self-attention written out (scores, mask, softmax: a part the counted steps find wide, so the
timed steps time the blocks' parts) and a head on the last position (its block's output
gradient mostly zero: its read span is read on every timed step); `--model mlp` is the
earlier 7-layer MLP (no part wide, no span). Each round says how many timed steps timed parts
and read spans.

    python benchmarks/compute_hooks_overhead.py [--model attn] [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import NamedTuple

import torch
from torch import nn

from gpudiag.probes.inject import gpudiag_compute as gc


class Attention(nn.Module):
    """Causal self-attention written out: scores, mask, softmax (a wide part)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        y = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = Attention(dim, heads)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.ff(x)


class LastPosition(nn.Module):
    """Blocks, then a head on the last position only (the last block's gradient: a span)."""

    def __init__(self, dim: int = 128, heads: int = 4, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(blocks))
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x[:, -1])


def make(kind: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model and one batch (inputs, labels)."""
    y = torch.randint(0, 10, (16,))
    if kind == "attn":
        return LastPosition(), torch.randn(16, 64, 128), y
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(6)])
    model.append(nn.Linear(256, 10))
    return model, torch.randn(16, 256), y


class Seen:
    """What the sampler's records show it read: timed steps, those that timed parts or read
    a span, counted steps."""

    def __init__(self) -> None:
        self.timed = self.parts = self.spans = self.counted = 0

    def add(self, recs: list[dict]) -> None:
        for r in recs:
            if r.get("count"):
                self.counted += 1
                continue
            self.timed += 1
            self.parts += bool(r.get("inner_s"))
            self.spans += any(len(row) == 8 for row in r.get("why") or ())

    def __str__(self) -> str:
        return (
            f"{self.timed} timed steps ({self.parts} timed parts, {self.spans} read a span), "
            f"{self.counted} counted"
        )


class Job(NamedTuple):
    model: nn.Module
    opt: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor


def rate(job: Job, sampler, seconds: float, seen: Seen) -> tuple[float, float]:
    """Steps per wall second and per second of the loop thread's CPU time (one intra-op
    thread: the step's work is the thread's; on a busy box the wall rate also holds the
    waits for a CPU, the CPU rate does not)."""
    t0, c0, n = time.perf_counter(), time.thread_time(), 0
    while time.perf_counter() - t0 < seconds:
        step(job)
        if sampler is not None:
            sampler.note_optimizer(job.opt)
            sampler.on_step()
            seen.add(sampler.take())
        n += 1
    return n / (time.perf_counter() - t0), n / (time.thread_time() - c0)


def step(job: Job) -> None:
    loss = nn.functional.cross_entropy(job.model(job.x), job.y)
    job.opt.zero_grad()
    loss.backward()
    job.opt.step()


def paired_extra(job: Job, sampler, counting: bool, pairs: int, seen: Seen) -> float:
    """The median over `pairs` of an armed step's wall time less the plain step's before it."""
    diffs = []
    for _ in range(pairs):
        t0 = time.perf_counter()
        step(job)
        t1 = time.perf_counter()
        sampler._arm(counting)
        step(job)
        sampler.note_optimizer(job.opt)
        sampler._finish()
        seen.add(sampler.take())
        diffs.append((time.perf_counter() - t1) - (t1 - t0))
    return statistics.median(diffs)


def paired(job: Job, pairs: int) -> None:
    """The timed and counted steps' extra (one sampler: its first counted step finds the wide
    parts the timed steps time)."""
    sampler, seen = gc.Sampler(torch, [job.model]), Seen()
    counted = paired_extra(job, sampler, True, max(10, pairs // 4), seen)
    timed = paired_extra(job, sampler, False, pairs, seen)
    print(f"paired: wide parts {sorted(sampler.wide)}; {seen}")
    every = max(gc.COUNT_MIN_S, max(0.0, counted) / gc.COUNT_BUDGET)
    steady = timed / gc.SAMPLE_EVERY_S + counted / every
    print(
        f"paired: a timed step +{timed * 1e3:.3f} ms, a counted step +{counted * 1e3:.2f} ms;"
        f" counted every {every:.1f} s: steady cost {steady:.3%} of the job's time; the "
        f"look's first {gc.COUNT_FIRST} counts {gc.COUNT_FIRST * counted / 10:.2%} of a 10 s look"
    )


def load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--paired", type=int, default=0, help="pairs of plain and armed steps")
    p.add_argument("--model", choices=("attn", "mlp"), default="attn")
    p.add_argument(
        "--group-sample",
        type=int,
        default=gc.GROUP_ZERO_SAMPLE,
        help="gradient elements a group's zero share reads (a huge one: every element, up to "
        "ZERO_SAMPLE a tensor, as before it was bounded)",
    )
    a = p.parse_args()
    gc.GROUP_ZERO_SAMPLE = a.group_sample
    torch.set_num_threads(1)
    model, x, y = make(a.model)
    job = Job(model, torch.optim.Adam(model.parameters()), x, y)
    print(f"model {a.model}, group sample {a.group_sample}; load {load()}")
    if a.paired:
        paired(job, a.paired)
    ratios, cpu = [], []
    for r in range(a.rounds):
        sampler = gc.Sampler(torch, [model])
        seen = Seen()
        got = {}
        for arm in ("off", "on") if r % 2 == 0 else ("on", "off"):  # the order turns
            got[arm] = rate(job, sampler if arm == "on" else None, a.seconds, seen)
        (off, off_cpu), (on, on_cpu) = got["off"], got["on"]
        ratios.append(off / on)
        cpu.append(off_cpu / on_cpu)
        print(
            f"round {r}: off {off:.1f} steps/s, on {on:.1f} steps/s, cost x{off / on:.4f}; "
            f"per CPU second: off {off_cpu:.1f}, on {on_cpu:.1f}, cost x{off_cpu / on_cpu:.4f}"
            f" ({seen}; load {load()})"
        )
    if ratios:
        print(
            f"median cost x{statistics.median(ratios):.4f} wall, x{statistics.median(cpu):.4f} "
            f"CPU time (1.01 = 1%); load {load()}"
        )


if __name__ == "__main__":
    main()
