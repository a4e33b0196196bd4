"""Rewrites a user would write for two of compute_open_world.py's planted causes, to time them
in the job with `gpudiag try --fix swap:...:with=open_world_rewrites.NAME` (no edit of the job):
each is the job's own --fixed form, as a function of the same signature as the one it replaces.

    gpudiag try --fix swap:compute_open_world.PrefixPool.forward:with=\
        open_world_rewrites.prefix_pool_forward -- python compute_open_world.py prefix_mean
    gpudiag try --fix swap:compute_open_world.Attention.forward:with=\
        open_world_rewrites.attention_forward -- python compute_open_world.py manual_attention

(the name after `with=` without the line break).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def prefix_pool_forward(self, x: torch.Tensor) -> torch.Tensor:
    """PrefixPool.forward with the running mean as one cumulative sum."""
    h = torch.relu(self.inp(x))
    t = h.shape[1]
    pooled = h.cumsum(dim=1) / torch.arange(1, t + 1).view(1, t, 1)
    return self.mlp(pooled[:, -1] + pooled.mean(dim=1))


def attention_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Attention.forward with torch's fused scaled_dot_product_attention."""
    b, t, d = x.shape
    h = self.heads
    q, k, v = self.qkv(x).split(d, dim=2)
    q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.proj(y.transpose(1, 2).reshape(b, t, d))
