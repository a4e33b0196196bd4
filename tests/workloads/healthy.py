"""Healthy, compute-bound job: data is ready in memory, the loop spends its time computing."""

import time

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, TensorDataset, default_collate

if __name__ == "__main__":
    args = parse_args(__doc__)
    data = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))
    model = small_cnn(width=48)

    def collate(items):
        if args.data_delay:
            time.sleep(args.data_delay)  # only with --data-delay: the gate's regression case
        return default_collate(items)

    train(
        model,
        lambda: DataLoader(data, batch_size=64, shuffle=True, collate_fn=collate),
        args.seconds,
    )
