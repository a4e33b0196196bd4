"""Planted DATA002: DataLoader workers already use every core; more workers cannot help."""

import os

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, Dataset


class VeryHeavyDecode(Dataset):
    def __len__(self):
        return 50_000

    def __getitem__(self, i):
        torch.set_num_threads(1)
        img = torch.rand(3, 32, 32)
        for _ in range(150):  # decoding + augmentation that costs far more than a step
            img = torch.nn.functional.avg_pool2d(img[None], 3, 1, 1)[0] + 0.01
        return img, i % 10


if __name__ == "__main__":
    args = parse_args(__doc__)
    workers = 2 * (os.cpu_count() or 1)
    model = small_cnn()
    train(
        model,
        lambda: DataLoader(
            VeryHeavyDecode(), batch_size=32, num_workers=workers, persistent_workers=True
        ),
        args.seconds,
    )
