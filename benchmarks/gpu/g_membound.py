"""Memory-bound: elementwise passes over 2 GiB fp32 tensors resident on the GPU (no matmul)."""

import torch
from _gcommon import args, loop

a = args()
dev = "cuda"
x = torch.randn(512 * 1024 * 1024, device=dev)
y = torch.empty_like(x)


def step(b):
    torch.mul(x, 1.0001, out=y)
    y.add_(0.5).relu_()
    x.copy_(y)


loop(step, lambda: [None] * 50, a)
