"""Ten more planted causes inside the training step (issue 55, "open world"), each with its fix
(--fixed); none of compute_planted.py's (float64, loss_loop, checkpoint, ema_deepcopy).

Work nobody needs:
- frozen_grad: a "frozen" backbone whose parameters still require grad (the optimizer holds only
  the head's): the backward computes its weight and input gradients for nothing; fix:
  backbone.requires_grad_(False).
- lm_head: a language-model head over every position when the loss reads only the last; fix:
  the head over the last position.
- over_wide: a hidden layer 16x wider than the part of its output the model reads; fix: a
  layer of the width read.
- dense_embed: a pretrained embedding table (100k rows) left trainable: its dense gradient and
  Adam's update of every row each step; fix: embed.requires_grad_(False).
Work in a slower form than the device offers:
- sample_loop: an encoder called once per sample in a Python loop over the batch; fix: one call.
- manual_attention: attention written out (scores, mask, softmax, product); fix: torch's
  scaled_dot_product_attention.
Work repeated:
- pos_table: a sinusoidal position table rebuilt by a loop over positions every forward; fix:
  built once.
- prefix_mean: a running mean over time recomputed from the start at every position (a loop
  over positions); fix: one cumulative sum.
- twice: the encoder run a second time on the same batch for an auxiliary loss; fix: its first
  output reused.
- const_encode: a frozen encoder run every step on the same constant prompts; fix: encoded once
  before the loop.
Controls (nothing planted): healthy (an MLP), transformer (a small causal LM).

    python compute_open_world.py CAUSE [--fixed] [--seconds S | --steps N] [--threads T]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
from _common import timed_steps
from torch import nn
from torch.nn import functional as F

WIDTH, BATCH, CLASSES = 512, 128, 10
VOCAB, DIM, SEQ = 1000, 128, 128


def mlp(width: int = WIDTH, depth: int = 3) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


class FrozenBackbone(nn.Module):
    """A pretrained backbone meant frozen, and a trained head."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.backbone = mlp(WIDTH, 4)
        self.head = nn.Linear(WIDTH, CLASSES)
        if fixed:
            self.backbone.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


class Attention(nn.Module):
    """Causal self-attention: torch's fused form, or written out."""

    def __init__(self, dim: int, heads: int, form: str) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads = heads
        self.form = form  # sdpa or manual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if self.form == "manual":  # the planted written-out attention
            s = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
            y = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, form: str) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, form)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.ff(self.n2(x))


def positional_table(t: int, d: int) -> torch.Tensor:
    """A sinusoidal position table, built position by position (the planted form, every step)."""
    table = torch.zeros(t, d)
    div = torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d))
    for pos in range(t):
        table[pos, 0::2] = torch.sin(pos * div)
        table[pos, 1::2] = torch.cos(pos * div)
    return table


class TinyLM(nn.Module):
    """A small causal LM over token ids: embedding, positions, layers, a vocabulary head."""

    def __init__(
        self, form: str = "sdpa", heads: int = 4, layers: int = 2, rebuild_pos: bool = False
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer(DIM, heads, form) for _ in range(layers))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.rebuild_pos = rebuild_pos
        self.register_buffer("pos", positional_table(4 * SEQ, DIM), persistent=False)

    def body(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        pos = positional_table(t, DIM) if self.rebuild_pos else self.pos[:t]
        x = self.embed(tokens) + pos
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(tokens))


class LastTokenLM(TinyLM):
    """Next-token prediction at the last position only."""

    def __init__(self, fixed: bool) -> None:
        super().__init__(layers=1)
        self.head = nn.Linear(DIM, 8 * VOCAB)  # a vocabulary of 8,000
        self.fixed = fixed

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.body(tokens)
        if self.fixed:
            return self.head(x[:, -1])
        return self.head(x)[:, -1]  # the planted head over every position


class OverWide(nn.Module):
    """An MLP whose first hidden layer is 16x wider than the part of it the model reads."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.used = WIDTH
        self.inp = nn.Linear(WIDTH, WIDTH if fixed else 16 * WIDTH)
        self.body = mlp(WIDTH, 2)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x)[:, : self.used])
        return self.head(self.body(h))


class EmbedClassifier(nn.Module):
    """A bag of pretrained word vectors (100k rows) and a trained MLP head."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(100_000, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES))
        if fixed:
            self.embed.requires_grad_(False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(tokens).mean(dim=1))


class PerSample(nn.Module):
    """An encoder and a head; the planted form calls the encoder once per sample."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.encoder = mlp(WIDTH, 2)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.fixed = fixed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed:
            return self.head(self.encoder(x))
        feats = [self.encoder(x[i : i + 1]) for i in range(x.shape[0])]
        return self.head(torch.cat(feats))


class PrefixPool(nn.Module):
    """Per-position features pooled causally (the mean of positions up to each), then an MLP."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(64, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES))
        self.fixed = fixed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))  # (batch, time, width)
        t = h.shape[1]
        if self.fixed:
            pooled = h.cumsum(dim=1) / torch.arange(1, t + 1).view(1, t, 1)
        else:  # the planted form: each position's mean from the start again
            pooled = torch.stack([h[:, : i + 1].mean(dim=1) for i in range(t)], dim=1)
        return self.mlp(pooled[:, -1] + pooled.mean(dim=1))


class AuxTwice(nn.Module):
    """An encoder, a classifier head and an auxiliary reconstruction head; the planted form runs
    the encoder again on the same batch for the auxiliary loss."""

    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.encoder = mlp(WIDTH, 4)
        self.head = nn.Linear(WIDTH, CLASSES)
        self.aux = nn.Linear(WIDTH, WIDTH)
        self.fixed = fixed

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encoder(x)
        z2 = z if self.fixed else self.encoder(x)  # the planted second pass
        return self.head(z), self.aux(z2)


class PromptClassifier(nn.Module):
    """Images scored against text prompts: a frozen prompt encoder over constant prompts and a
    trained image encoder (a CLIP-style linear probe)."""

    def __init__(self) -> None:
        super().__init__()
        self.text = nn.Sequential(nn.Embedding(VOCAB, WIDTH), mlp(WIDTH, 4))
        self.image = nn.Sequential(nn.Linear(64, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
        self.text.requires_grad_(False)

    def encode_prompts(self, prompts: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.text(prompts).mean(dim=1)

    def forward(self, x: torch.Tensor, prompts: torch.Tensor | None, cached=None) -> torch.Tensor:
        t = cached if cached is not None else self.encode_prompts(prompts)
        return self.image(x) @ t.T


class Step:
    """One cause's model, optimizer, batch and step."""

    def __init__(self, cause: str, fixed: bool) -> None:
        self.cause, self.fixed = cause, fixed
        self.extra: dict = {}
        build: dict[str, Callable[[], nn.Module]] = {
            "frozen_grad": lambda: FrozenBackbone(fixed),
            "lm_head": lambda: LastTokenLM(fixed),
            "over_wide": lambda: OverWide(fixed),
            "dense_embed": lambda: EmbedClassifier(fixed),
            "prefix_mean": lambda: PrefixPool(fixed),
            "sample_loop": lambda: PerSample(fixed),
            "manual_attention": lambda: TinyLM("sdpa" if fixed else "manual", heads=4),
            "pos_table": lambda: TinyLM(layers=1, rebuild_pos=not fixed),
            "twice": lambda: AuxTwice(fixed),
            "const_encode": PromptClassifier,
            "healthy": lambda: nn.Sequential(mlp(WIDTH, 4), nn.Linear(WIDTH, CLASSES)),
            "transformer": lambda: TinyLM(),
        }
        self.model = build[cause]()
        params = self.model.head.parameters() if cause == "frozen_grad" else self.model.parameters()
        self.opt = torch.optim.Adam([p for p in params if p.requires_grad], lr=1e-4)
        self.x, self.y = self._batch()

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cause
        if c in ("lm_head", "manual_attention", "pos_table", "transformer"):
            b = {"lm_head": 8, "pos_table": 1, "manual_attention": 4}.get(c, 16)
            t = 2 * SEQ if c in ("pos_table", "manual_attention") else SEQ
            tokens = torch.randint(0, VOCAB, (b, t))
            return tokens, torch.randint(0, VOCAB, (b,) if c == "lm_head" else (b, t))
        if c == "prefix_mean":
            return torch.randn(16, SEQ, 64), torch.randint(0, CLASSES, (16,))
        if c == "dense_embed":
            return torch.randint(0, 100_000, (BATCH, 32)), torch.randint(0, CLASSES, (BATCH,))
        if c == "const_encode":
            self.extra["prompts"] = torch.randint(0, VOCAB, (CLASSES, 64))
            if self.fixed:
                self.extra["cached"] = self.model.encode_prompts(self.extra["prompts"])
            return torch.randn(BATCH, 64), torch.randint(0, CLASSES, (BATCH,))
        return torch.randn(BATCH, WIDTH), torch.randint(0, CLASSES, (BATCH,))

    def loss(self) -> torch.Tensor:
        c, m = self.cause, self.model
        if c == "const_encode":
            out = m(self.x, self.extra["prompts"], self.extra.get("cached"))
        else:
            out = m(self.x)
        if c == "twice":
            logits, recon = out
            return F.cross_entropy(logits, self.y) + 0.1 * F.mse_loss(recon, self.x)
        if out.dim() == 3:
            return F.cross_entropy(out.flatten(0, 1), self.y.flatten())
        return F.cross_entropy(out, self.y)

    def step(self) -> None:
        loss = self.loss()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


CAUSES = (
    "frozen_grad",
    "lm_head",
    "over_wide",
    "dense_embed",
    "prefix_mean",
    "sample_loop",
    "manual_attention",
    "pos_table",
    "twice",
    "const_encode",
)
CONTROLS = ("healthy", "transformer")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cause", choices=CAUSES + CONTROLS)
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps instead")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    job = Step(a.cause, a.fixed)
    timed_steps(job.step, a.seconds, a.steps)


if __name__ == "__main__":
    main()
