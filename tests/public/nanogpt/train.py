# MIT License. Copyright (c) 2022 Andrej Karpathy.
# Modelled on https://github.com/karpathy/nanoGPT/blob/3adf61e154c3fe3fca428ad6bc3818b27a3b8291/train.py
# and model.py, with config/train_shakespeare_char.py and the README's CPU settings
# (--device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12
# --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0):
# the GPT (causal self-attention with SDPA, GELU MLP, pre-LN blocks, tied lm_head), the "poor
# man's data loader" that re-opens np.memmap for every batch, AdamW with decay groups, cosine lr
# with warm-up, grad clip 1.0, loss.item() logging every step, estimate_loss every eval_interval
# and a checkpoint (model + optimizer) when the val loss improves. Changed for gpudiag's tests
# (tests/public/README.md): train.bin/val.bin are random uint16 tokens written on the fly (no
# prepare.py download), vocab 65, argparse instead of configurator.py, no DDP/wandb/compile;
# time-bounded by PUBLIC_SECONDS; --no-checkpoint skips the checkpoint.
"""nanoGPT shakespeare_char on CPU (the README's CPU settings) with synthetic tokens."""

import argparse
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout = n_head, n_embd, dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        p = self.dropout if self.training else 0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--eval_interval", type=int, default=250)
ap.add_argument("--eval_iters", type=int, default=20)
ap.add_argument("--log_interval", type=int, default=1)
ap.add_argument("--always_save_checkpoint", action="store_true")
ap.add_argument("--batch_size", type=int, default=12)
ap.add_argument("--block_size", type=int, default=64)
ap.add_argument("--n_layer", type=int, default=4)
ap.add_argument("--n_head", type=int, default=4)
ap.add_argument("--n_embd", type=int, default=128)
ap.add_argument("--dropout", type=float, default=0.0)
ap.add_argument("--learning_rate", type=float, default=1e-3)
ap.add_argument("--max_iters", type=int, default=2000)
ap.add_argument("--lr_decay_iters", type=int, default=2000)
ap.add_argument("--no-checkpoint", action="store_true", help="fix: no checkpoint after eval")
cfg = ap.parse_args()
weight_decay, beta1, beta2, grad_clip = 1e-1, 0.9, 0.99, 1.0
warmup_iters, min_lr = 100, 1e-4
out_dir = tempfile.TemporaryDirectory(prefix="nanogpt-")
data_dir = out_dir.name
rng = np.random.default_rng(1337)
for split, n in (("train", 1_000_000), ("val", 100_000)):
    rng.integers(0, 65, size=n, dtype=np.uint16).tofile(os.path.join(data_dir, f"{split}.bin"))
torch.manual_seed(1337)
device = "cpu"


def get_batch(split):
    # We recreate np.memmap every batch to avoid a memory leak (as nanoGPT does)
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - cfg.block_size, (cfg.batch_size,))
    x = torch.stack([torch.from_numpy((data[i : i + cfg.block_size]).astype(np.int64)) for i in ix])
    y = torch.stack(
        [torch.from_numpy((data[i + 1 : i + 1 + cfg.block_size]).astype(np.int64)) for i in ix]
    )
    return x.to(device), y.to(device)


model = GPT(65, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.dropout).to(device)
optimizer = model.configure_optimizers(weight_decay, cfg.learning_rate, (beta1, beta2))
iter_num, best_val_loss = 0, 1e9


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(cfg.eval_iters)
        for k in range(cfg.eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return cfg.learning_rate * (it + 1) / (warmup_iters + 1)
    if it > cfg.lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (cfg.lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - min_lr)


X, Y = get_batch("train")
t0 = time.time()
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % cfg.eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss or cfg.always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0 and not cfg.no_checkpoint:
                checkpoint = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "config": vars(cfg),
                }
                print(f"saving checkpoint to {out_dir.name}")
                torch.save(checkpoint, os.path.join(out_dir.name, "ckpt.pt"))
    _, loss = model(X, Y)
    X, Y = get_batch("train")  # async prefetch on GPU; here simply the next batch
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num % cfg.log_interval == 0:
        print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms")
    iter_num += 1
    if clock.step() or iter_num > cfg.max_iters:
        break
