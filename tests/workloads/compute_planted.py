"""Planted causes inside the training step (issue 55), each with its fix (--fixed):

- float64: one block of an MLP computes in float64 (its weights and input .double()); fix:
  float32 like the rest.
- loss_loop: the loss computed by a Python loop over the batch's samples; fix: one batched
  cross_entropy.
- checkpoint: activation checkpointing on every block of a small model that fits with room to
  spare; fix: no checkpointing.
- ema_deepcopy: an EMA of the weights kept by `copy.deepcopy(model)` every step; fix: an
  in-place lerp of the EMA's parameters.
- healthy: the same MLP, nothing planted (a control).
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

WIDTH, DEPTH, BATCH, CLASSES = 512, 4, 128, 10


class Block(nn.Module):
    def __init__(self, double: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.double_ = double
        if double:
            self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.double_:
            return torch.relu(self.norm(self.fc(x.double()))).float()
        return torch.relu(self.norm(self.fc(x)))


class Net(nn.Module):
    def __init__(self, cause: str, fixed: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(64, WIDTH)
        planted = not fixed
        self.blocks = nn.ModuleList(
            Block(double=(cause == "float64" and planted and i == 1)) for i in range(DEPTH)
        )
        self.head = nn.Linear(WIDTH, CLASSES)
        self.ckpt = cause == "checkpoint" and planted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return self.head(x)


def loss_of(out: torch.Tensor, y: torch.Tensor, loop: bool) -> torch.Tensor:
    if not loop:
        return nn.functional.cross_entropy(out, y)
    total = out.new_zeros(())
    for i in range(out.shape[0]):  # the planted per-sample loop
        logp = torch.log_softmax(out[i], dim=0)
        total = total - logp[y[i]]
    return total / out.shape[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "cause", choices=("float64", "loss_loop", "checkpoint", "ema_deepcopy", "healthy")
    )
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps instead")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Net(a.cause, a.fixed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ema = copy.deepcopy(model) if a.cause == "ema_deepcopy" else None
    xs, ys = torch.randn(BATCH, 64), torch.randint(0, CLASSES, (BATCH,))
    ready = os.environ.get("GPUDIAG_TEST_READY")
    t0, steps = time.perf_counter(), 0
    while True:
        loss = loss_of(model(xs), ys, a.cause == "loss_loop" and not a.fixed)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if ema is not None:
            if a.fixed:
                with torch.no_grad():
                    for pe, pm in zip(ema.parameters(), model.parameters(), strict=True):
                        pe.lerp_(pm, 0.001)
            else:  # the planted EMA: a whole new copy every step
                new = copy.deepcopy(model)
                with torch.no_grad():
                    for pn, pe in zip(new.parameters(), ema.parameters(), strict=True):
                        pn.mul_(0.001).add_(pe, alpha=0.999)
                ema = new
        steps += 1
        if ready and steps == 1:
            open(ready, "w").close()
        took = time.perf_counter() - t0
        if (a.steps and steps >= a.steps) or (not a.steps and took >= a.seconds):
            break
    print(f"steps: {steps} in {took:.2f} s ({steps / took:.2f} steps/s)", flush=True)


if __name__ == "__main__":
    main()
