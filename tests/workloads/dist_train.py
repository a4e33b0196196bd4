"""A tiny data-parallel job for `torchrun` on the CPU (gloo), with planted rank problems.

Each rank trains a small MLP on its own batches and averages its gradients with one
`all_reduce` of the flattened gradients per step. A layer that sleeps stands for GPU work: the
ranks then do not compete for the CPU cores of a small test machine, where that contention
would itself make ranks wait for each other. With --ddp, DistributedDataParallel averages the
gradients instead. Planted problems:

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

BATCH = 32


class Batches(Dataset):
    """Random samples; slow on the rank told to be slow."""

    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay / BATCH)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 10, (1,), generator=g)[0]


class GpuLike(nn.Module):
    """Waits as a GPU kernel would, without using a CPU core."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return x


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
    delay = float(os.environ.get("GPUDIAG_TEST_DATA_DELAY", "0.1"))
    hang_rank = os.environ.get("GPUDIAG_TEST_HANG_RANK")
    hang_step = int(os.environ.get("GPUDIAG_TEST_HANG_STEP", "20"))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10), GpuLike(0.03))
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Batches(100_000, delay if slow is not None and int(slow) == rank else 0.0)
    loader = DataLoader(data, batch_size=BATCH, num_workers=0)
    t0 = time.time()
    step = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if hang_rank is not None and int(hang_rank) == rank and step == hang_step:
            wait_for_signal_file()
        if not args.ddp:
            grads = [prm.grad for prm in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= world
            torch.nn.utils.vector_to_parameters(flat, grads)
        opt.step()
        step += 1
        # every rank stops at the same step: rank 0's clock decides
        stop = torch.tensor([float(rank == 0 and time.time() - t0 > args.seconds)])
        dist.broadcast(stop, src=0)
        if stop.item():
            break
    dist.barrier()
    print(f"rank {rank}: {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
