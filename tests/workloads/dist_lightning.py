"""Lightning with strategy="ddp" on 2 CPU processes (gloo); rank 1's data is slow when
GPUDIAG_TEST_SLOW_RANK=1 (GPUDIAG_TEST_DATA_DELAY seconds per batch). Run it under torchrun
(Lightning then takes the ranks torchrun made) or plain (Lightning spawns rank 1 itself)."""

from __future__ import annotations

import os
import sys
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

BATCH = 32


class Data(Dataset):
    def __len__(self) -> int:
        return 2_000_000

    def __getitem__(self, i: int):
        rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
        if os.environ.get("GPUDIAG_TEST_SLOW_RANK") == str(rank):
            time.sleep(float(os.environ.get("GPUDIAG_TEST_DATA_DELAY", "0.1")) / BATCH)
        return torch.randn(64), torch.randint(0, 10, (1,))[0]


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def training_step(self, batch, i):
        time.sleep(0.03)  # stands for GPU work
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.set_num_threads(1)
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_time={"seconds": seconds},
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), DataLoader(Data(), batch_size=BATCH, num_workers=0))
