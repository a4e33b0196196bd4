"""Planted DATA001: num_workers=0 and a CPU-heavy per-sample transform starve the loop."""

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, Dataset


class SlowAugment(Dataset):
    def __len__(self):
        return 50_000

    def __getitem__(self, i):
        img = torch.rand(3, 32, 32)
        for _ in range(25):  # an expensive augmentation chain
            img = torch.nn.functional.avg_pool2d(img[None], 3, 1, 1)[0] + 0.01
        return img, i % 10


if __name__ == "__main__":
    args = parse_args(__doc__)
    model = small_cnn()
    train(model, lambda: DataLoader(SlowAugment(), batch_size=32, num_workers=0), args.seconds)
