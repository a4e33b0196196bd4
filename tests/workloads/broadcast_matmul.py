"""A cause in no catalogue: a layer that multiplies by broadcasting and summing
(`(x[:, :, None] * W[None]).sum(1)`, a [batch, in, out] intermediate) where one matrix
product does the same work. `--fixed` uses `x @ W`.

    python broadcast_matmul.py [--fixed] [--seconds 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import timed_steps  # noqa: E402

BATCH, DIM, CLASSES = 64, 256, 10


class Mix(nn.Module):
    """A dense layer; planted: its product by broadcast and sum."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(DIM, DIM) / DIM**0.5)
        self.fixed = fixed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed:
            return x @ self.weight
        return (x[:, :, None] * self.weight[None]).sum(dim=1)


class Net(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.inp, self.mix, self.head = nn.Linear(DIM, DIM), Mix(fixed), nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.mix(torch.relu(self.inp(x)))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Net(a.fixed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, DIM), torch.randint(0, CLASSES, (BATCH,))

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    timed_steps(step, a.seconds)


if __name__ == "__main__":
    main()
