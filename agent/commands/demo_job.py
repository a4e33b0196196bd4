"""The demo's training job: a small CNN whose input pipeline is starved.

The planted bottleneck: DataLoader(num_workers=0) with a CPU-heavy per-sample transform, so
the training loop spends most of its time making batches itself.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class NoisyImages(Dataset):
    """Synthetic 3x64x64 images with an expensive augmentation done in Python."""

    def __init__(self, n: int = 100_000) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def augment(self, img: torch.Tensor) -> torch.Tensor:
        """A deliberately slow augmentation: repeated blurs and random crops."""
        for _ in range(12):
            img = torch.nn.functional.avg_pool2d(img[None], 3, 1, 1)[0]
            img = img + 0.01 * torch.randn_like(img)
        return img

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, 64, 64, generator=g)
        return self.augment(img), i % 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(8),
        nn.Flatten(),
        nn.Linear(16 * 64, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(NoisyImages(), batch_size=32, shuffle=True, num_workers=0)
    t0 = time.time()
    steps = 0
    while time.time() - t0 < args.seconds:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if time.time() - t0 >= args.seconds:
                break
    print(f"demo job: {steps} steps")


if __name__ == "__main__":
    main()
