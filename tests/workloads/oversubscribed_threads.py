"""Planted HOST003: torch.set_num_threads(16) in the main process and 4 intra-op threads
in each of 2 DataLoader workers computing a transform, on a box with a few cores
(--fix: the pools sized to the cores the job may use)."""

import os
import sys

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, Dataset


class Mixed(Dataset):
    """Samples whose transform runs torch ops (a colour mix by a random matrix)."""

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        img = torch.rand(3, 64 * 64)
        mix = torch.rand(64 * 64, 64 * 64 // 16)
        return (img @ mix).reshape(3, 16, 16).repeat(1, 2, 2), i % 10


if __name__ == "__main__":
    fix = "--fix" in sys.argv
    if fix:
        sys.argv.remove("--fix")
    args = parse_args(__doc__)
    cores = len(os.sched_getaffinity(0))
    workers = 2
    main_threads = max(1, cores - workers) if fix else 16
    worker_threads = 1 if fix else 4
    torch.set_num_threads(main_threads)
    model = small_cnn(width=64)
    loader = DataLoader(
        Mixed(),
        batch_size=32,
        num_workers=workers,
        worker_init_fn=lambda _: torch.set_num_threads(worker_threads),
        persistent_workers=True,
    )
    train(model, lambda: loader, args.seconds)
