"""A tiny data-parallel job for `torchrun` on the CPU (gloo), with planted rank problems.

Each rank trains a small MLP on its own batches and averages its gradients with one
`all_reduce` per step (or through DistributedDataParallel with --ddp). Planted problems:

* GPUDIAG_TEST_SLOW_RANK=R with GPUDIAG_TEST_DATA_DELAY=S: rank R's Dataset sleeps S seconds
  per batch (its DataLoader is slow): rank R is the straggler, the others wait for it in
  the all_reduce.
* GPUDIAG_TEST_HANG_RANK=R with GPUDIAG_TEST_HANG_STEP=N: at step N rank R skips the
  all_reduce and waits forever in `wait_for_signal_file` (the others hang in the collective).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    """Random samples; slow on the rank told to be slow."""

    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 10, (1,), generator=g)[0]


def wait_for_signal_file() -> None:
    """The planted hang: this rank never reaches the collective the others wait in."""
    while not os.path.exists("/nonexistent/gpudiag-test-release"):
        time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--ddp", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = os.environ.get("GPUDIAG_TEST_SLOW_RANK")
    delay = float(os.environ.get("GPUDIAG_TEST_DATA_DELAY", "0.05"))
    hang_rank = os.environ.get("GPUDIAG_TEST_HANG_RANK")
    hang_step = int(os.environ.get("GPUDIAG_TEST_HANG_STEP", "20"))
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.Linear(512, 10))
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Batches(100_000, delay if slow is not None and int(slow) == rank else 0.0)
    loader = DataLoader(data, batch_size=32, num_workers=0)
    t0 = time.time()
    step = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if hang_rank is not None and int(hang_rank) == rank and step == hang_step:
            wait_for_signal_file()
        if not args.ddp:
            for prm in model.parameters():
                dist.all_reduce(prm.grad)
                prm.grad /= world
        opt.step()
        step += 1
        if time.time() - t0 > args.seconds:
            break
    dist.barrier()
    print(f"rank {rank}: {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
