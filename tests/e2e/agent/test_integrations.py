"""The Lightning and Hugging Face callbacks hook real training loops (tiny models, CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.inprocess.channel import HookProbe

LIGHTNING = """
import torch, lightning as L
from gpudiag.probes.integrations import lightning_callback

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return ((self.l(x) - y) ** 2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

data = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(256, 4), torch.randn(256, 1)), batch_size=8)
L.Trainer(max_steps=25, accelerator="cpu", logger=False, enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False,
          callbacks=[lightning_callback()]).fit(Tiny(), data)
"""

HF = """
import sys, torch
from transformers import Trainer, TrainingArguments
from gpudiag.probes.integrations import hf_callback

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(4, 1)
    def forward(self, x, labels=None):
        return {"loss": ((self.l(x).squeeze(-1) - labels) ** 2).mean()}

data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(256)]
args = TrainingArguments(output_dir=sys.argv[1], max_steps=20, per_device_train_batch_size=4,
                         report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[hf_callback()]).train()
"""


def steps_seen(script: str, *args: str) -> tuple[float, float]:
    probe = HookProbe()
    probe.open(Target(0))
    try:
        env = dict(os.environ, GPUDIAG_CHANNEL=probe.path or "")
        res = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        samples = probe.sample()
    finally:
        probe.close()
    steps = sum(1 for s in samples if s.labels.get("kind") == "step")
    batch = sum(s.values.get("batch_size", 0) for s in samples)
    return steps, batch


@pytest.mark.long
def test_lightning_callback_counts_every_step():
    pytest.importorskip("lightning")
    steps, batch = steps_seen(LIGHTNING)
    assert steps == 25
    assert batch >= 24 * 8


def test_hf_trainer_callback_counts_every_step(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    steps, _ = steps_seen(HF, str(tmp_path))
    assert steps == 20
