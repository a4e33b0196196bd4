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
- transformer, embedding: healthy controls of other shapes (a small transformer encoder over
  token ids; a bag-of-embeddings classifier over a 20k vocabulary), nothing planted.
"""

from __future__ import annotations

import argparse
import copy

import torch
from _common import timed_steps
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


class TinyTransformer(nn.Module):
    """A healthy control: two encoder layers over 64 tokens of a 1000-word vocabulary."""

    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 4, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)).mean(dim=1))


class BagOfEmbeddings(nn.Module):
    """A healthy control: a batched embedding bag over a 20k vocabulary and an MLP head."""

    def __init__(self, dim: int = 256) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(20000, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(tokens))


CONTROLS = {"transformer": TinyTransformer, "embedding": BagOfEmbeddings}


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
        "cause",
        choices=("float64", "loss_loop", "checkpoint", "ema_deepcopy", "healthy", *CONTROLS),
    )
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps instead")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = CONTROLS[a.cause]() if a.cause in CONTROLS else Net(a.cause, a.fixed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    xs, ys = torch.randn(BATCH, 64), torch.randint(0, CLASSES, (BATCH,))
    if a.cause in CONTROLS:
        xs = torch.randint(0, 1000, (BATCH // 4 if a.cause == "transformer" else BATCH, 64))
        ys = ys[: xs.shape[0]]
    ema_box = [copy.deepcopy(model) if a.cause == "ema_deepcopy" else None]

    def step() -> None:
        loss = loss_of(model(xs), ys, a.cause == "loss_loop" and not a.fixed)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema = ema_box[0]
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
                ema_box[0] = new

    timed_steps(step, a.seconds, a.steps)


if __name__ == "__main__":
    main()
