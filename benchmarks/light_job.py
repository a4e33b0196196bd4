"""A light training job for the agent-cost benchmark: a small MLP fed by a DataLoader whose
__getitem__ sleeps 2 ms (loading that costs wall time but almost no CPU).

    python benchmarks/light_job.py --workers 8 --seconds 30

Prints `steps: N in S s` at the end (and on SIGTERM/SIGINT): the steps of the --seconds after
a --warmup (default 0) that is not counted.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SleepyData(Dataset):
    """Items of 64 floats; each costs `delay_s` of sleeping to load."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.delay_s)
        return torch.full((64,), float(i % 7)), i % 10


def main() -> None:
    """Train until --seconds pass (or a signal), then print the step count."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--delay", type=float, default=0.002)
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds run before counting")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(
        SleepyData(args.delay),
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    steps = 0
    start = time.time()
    t0 = start + args.warmup
    end = t0 + args.seconds
    print("ready", flush=True)
    while not stop and time.time() < end:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if time.time() >= t0:
                steps += 1
            if stop or time.time() >= end:
                break
    print(f"steps: {steps} in {time.time() - max(t0, start):.2f} s", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
