# Apache License 2.0. Copyright The Lightning AI team.
# Modelled on https://github.com/Lightning-AI/pytorch-lightning/blob/master/examples/pytorch/basics/backbone_image_classifier.py
# (LitClassifier: a Backbone of two Linear layers, cross-entropy, self.log("train_loss"), Adam,
# an MNIST-shaped DataModule, Trainer.fit) with the checkpoint callback that the Lightning docs
# show for step-based saving: ModelCheckpoint(every_n_train_steps=5). Changed for gpudiag's tests
# (tests/public/README.md): random 28x28 images instead of the MNIST download, hidden_dim 4096,
# CPU; time-bounded by PUBLIC_SECONDS (a callback sets trainer.should_stop);
# --ckpt-every 0 is the fix: no step checkpoints (ModelCheckpoint's default: once per epoch).
"""A Lightning image classifier that checkpoints every 5 training steps."""

import argparse
import os
import sys
import tempfile
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402


class Backbone(torch.nn.Module):
    def __init__(self, hidden_dim=128):
        super().__init__()
        self.l1 = torch.nn.Linear(28 * 28, hidden_dim)
        self.l2 = torch.nn.Linear(hidden_dim, 10)

    def forward(self, x):
        x = x.view(x.size(0), -1)
        x = torch.relu(self.l1(x))
        return torch.relu(self.l2(x))


class LitClassifier(L.LightningModule):
    def __init__(self, backbone=None, learning_rate=0.0001):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = backbone or Backbone()

    def forward(self, x):
        return self.backbone(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


class MyDataModule(L.LightningDataModule):
    def __init__(self, batch_size=32, n=6000):
        super().__init__()
        self.batch_size, self.n = batch_size, n

    def setup(self, stage):
        g = torch.Generator().manual_seed(0)
        x = torch.rand(self.n, 1, 28, 28, generator=g)
        self.train_set = TensorDataset(x, torch.randint(0, 10, (self.n,), generator=g))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)


class TimeLimit(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if clock.step():
            trainer.should_stop = True


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hidden-dim", type=int, default=4096)
    ap.add_argument("--ckpt-every", type=int, default=5, help="0: fix, no step checkpoints")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    with tempfile.TemporaryDirectory(prefix="lit-ckpt-") as d:
        every = args.ckpt_every or None
        ckpt = ModelCheckpoint(dirpath=d, every_n_train_steps=every)
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=100,
            callbacks=[ckpt, TimeLimit()],
            default_root_dir=d,
            logger=False,
        )
        model = LitClassifier(Backbone(hidden_dim=args.hidden_dim))
        trainer.fit(model, datamodule=MyDataModule())


if __name__ == "__main__":
    main()
