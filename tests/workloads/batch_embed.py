"""Planted INFER001: a batch-embedding job, `for batch in loader: model(batch)` with no
backward, run with autograd on; --inference-mode is the fix (the healthy variant)."""

import contextlib
import time

import torch
from _common import parse_args
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def encoder(vocab: int = 1000, dim: int = 128) -> nn.Module:
    """A small transformer encoder that mean-pools its tokens into one embedding."""
    layer = nn.TransformerEncoderLayer(dim, 4, dim * 4, dropout=0.0, batch_first=True)
    body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    class Embedder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.body = nn.Embedding(vocab, dim), body

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.body(self.embed(tokens)).mean(dim=1)

    return Embedder().eval()


if __name__ == "__main__":
    import sys

    fixed = "--inference-mode" in sys.argv
    if fixed:
        sys.argv.remove("--inference-mode")
    args = parse_args(__doc__)
    torch.manual_seed(0)
    data = TensorDataset(torch.randint(0, 1000, (4096, 32)))
    model = encoder()
    mode = torch.inference_mode if fixed else contextlib.nullcontext
    t0, items, out = time.time(), 0, []
    while time.time() - t0 < args.seconds:
        for (batch,) in DataLoader(data, batch_size=16):
            with mode():
                out.append(model(batch)[:, :4].clone())
            items += len(batch)
            out = out[-64:]
            if time.time() - t0 >= args.seconds:
                break
    took = time.time() - t0
    print(f"embedded {items} items in {took:.1f} s: {items / took:.0f} items/s", flush=True)
