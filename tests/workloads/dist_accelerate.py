"""Hugging Face accelerate on 2 CPU processes (`accelerate launch --cpu --num_processes 2`);
rank 1's data is slow when GPUDIAG_TEST_SLOW_RANK=1 (GPUDIAG_TEST_DATA_DELAY s per batch)."""

from __future__ import annotations

import os
import sys
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

BATCH = 32


class Data(Dataset):
    def __len__(self) -> int:
        return 2_000_000

    def __getitem__(self, i: int):
        if os.environ.get("GPUDIAG_TEST_SLOW_RANK") == os.environ.get("RANK"):
            time.sleep(float(os.environ.get("GPUDIAG_TEST_DATA_DELAY", "0.1")) / BATCH)
        return torch.randn(64), torch.randint(0, 10, (1,))[0]


def main() -> None:
    torch.set_num_threads(1)
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    acc = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Data(), batch_size=BATCH, num_workers=0)
    model, opt, loader = acc.prepare(model, opt, loader)
    t0 = time.time()
    for x, y in loader:
        time.sleep(0.03)  # stands for GPU work
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        stop = torch.tensor([float(acc.is_main_process and time.time() - t0 > seconds)])
        if acc.reduce(stop, reduction="sum").item():  # every rank stops at the same step
            break
    acc.end_training()


if __name__ == "__main__":
    main()
