"""A DDP job written the way users write them, for `torchrun` on the CPU (gloo), with one
planted rank problem chosen by GPUDIAG_TEST_PLANT (on rank GPUDIAG_TEST_SLOW_RANK, default 1,
GPUDIAG_TEST_DELAY seconds, default 0.06):

* ``loop``: the rank does extra work in its own loop before the forward pass (as a slow
  input transform written in the loop would): a straggler outside forward/backward/optimizer;
* ``data``: the rank's Dataset is slow (its DataLoader);
* ``backward``: the rank's backward is slower (more work on this rank's device);
* ``hang``: at step GPUDIAG_TEST_HANG_STEP (20) the rank stops calling forward/backward; the
  others block in DDP's gradient all-reduce under ``loss.backward()``;
* ``eval``: every rank evaluates for GPUDIAG_TEST_DELAY seconds after step
  GPUDIAG_TEST_HANG_STEP (rank 0 longer: the others wait in a barrier), then trains on.

A layer that sleeps stands for GPU work, so the ranks do not compete for the CPU cores.
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
    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay / BATCH)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 10, (1,), generator=g)[0]


class SlowGrad(torch.autograd.Function):
    """Sleeps in forward and backward as GPU kernels would, without a CPU core."""

    @staticmethod
    def forward(ctx, x, fwd_s: float, bwd_s: float):
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.bwd_s)
        return grad, None, None


class Net(nn.Module):
    def __init__(self, bwd_s: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        self.bwd_s = bwd_s

    def forward(self, x):
        return SlowGrad.apply(self.body(x), 0.015, self.bwd_s)


def augment(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """The planted per-step work in the rank's own loop."""
    time.sleep(seconds)
    return x


def stalled() -> None:
    """The planted hang: this rank never calls backward again."""
    while not os.path.exists("/nonexistent/gpudiag-test-release"):
        time.sleep(0.2)


def evaluate(model: nn.Module, seconds: float) -> None:
    """A long evaluation pass (no collectives inside)."""
    model.eval()
    with torch.no_grad():
        end = time.time() + seconds
        while time.time() < end:
            model(torch.randn(BATCH, 64))
            time.sleep(0.05)
    model.train()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    plant = os.environ.get("GPUDIAG_TEST_PLANT", "")
    me = rank == int(os.environ.get("GPUDIAG_TEST_SLOW_RANK", "1"))
    delay = float(os.environ.get("GPUDIAG_TEST_DELAY", "0.06"))
    at = int(os.environ.get("GPUDIAG_TEST_HANG_STEP", "20"))
    model = nn.parallel.DistributedDataParallel(
        Net(0.015 + (delay if plant == "backward" and me else 0.0))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Batches(100_000, delay if plant == "data" and me else 0.0)
    t0 = time.time()
    step = 0
    for x, y in DataLoader(data, batch_size=BATCH, num_workers=0):
        if plant == "loop" and me:
            x = augment(x, delay)
        if plant == "hang" and me and step == at:
            stalled()
        if plant == "eval" and step and step % at == 0:
            evaluate(model, delay * (1.5 if rank == 0 else 1.0))
            dist.barrier()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        stop = torch.tensor([float(rank == 0 and time.time() - t0 > args.seconds)])
        dist.broadcast(stop, src=0)
        if stop.item():
            break
    dist.barrier()
    print(f"rank {rank}: {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
