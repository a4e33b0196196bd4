"""A loader that waits: __getitem__ sleeps 0.5 ms per sample (a network or object-store read).

num_workers=0 by default (--workers N to apply the fix). The loaders are off-CPU while they
load, so more workers overlap the waits even on a busy box: DATA001 recommending workers.
"""

import time

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, Dataset


class Remote(Dataset):
    """Each sample waits 0.5 ms, as a small object-store GET would."""

    def __init__(self, n: int = 4096) -> None:
        self.x = torch.randn(n, 3, 32, 32)
        self.y = torch.randint(0, 10, (n,))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(0.0005)
        return self.x[i], self.y[i]


if __name__ == "__main__":
    import argparse
    import sys

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--workers", type=int, default=0)
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_args(__doc__)
    data = Remote()
    model = small_cnn()
    train(
        model,
        lambda: DataLoader(data, batch_size=32, shuffle=True, num_workers=known.workers),
        args.seconds,
    )
