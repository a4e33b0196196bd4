"""Planted CKPT001: a large checkpoint is saved synchronously every few steps."""

import os
import tempfile

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, TensorDataset


def save_checkpoint(model, ema, path):
    torch.save({"model": model.state_dict(), "ema": ema}, path)


if __name__ == "__main__":
    args = parse_args(__doc__)
    data = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))
    model = small_cnn()
    ema = torch.randn(48 << 20)  # 192 MB of extra state (EMA weights) in every checkpoint
    with tempfile.TemporaryDirectory(prefix="gpudiag-ckpt-") as d:
        path = os.path.join(d, "ckpt.pt")

        def maybe_save(step):
            if step % 10 == 0:
                save_checkpoint(model, ema, path)

        train(
            model,
            lambda: DataLoader(data, batch_size=32, shuffle=True),
            args.seconds,
            after_step=maybe_save,
        )
