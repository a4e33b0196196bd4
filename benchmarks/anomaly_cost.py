"""What autograd's anomaly detection costs a training step, against what the stacks see of it:
DEBUG001's range checked. For each model, training steps with anomaly detection on and off
alternate in blocks in one process (a busy box's drift hits both arms alike); with it on,
the time inside its stack records (torch.fx.traceback.format_stack, which torch's C++ calls
per op and which the stacks show) is timed by a wrapper. Per model: the record share of the
step (what DEBUG001 measures from the stacks), the whole overhead share, and their ratio,
which `RECORD_TO_WHOLE` in analyzers/findings/debug_switches.py must cover.

Models, built here or by their libraries, one torch thread: the planted MLP
(/work/heldout5-style anomaly_train.py), Lightning's demo Transformer
(lightning.pytorch.demos.transformer), a BERT from transformers' config, a small conv net.

    python benchmarks/anomaly_cost.py --rounds 5 --steps 20
    python benchmarks/anomaly_cost.py --job bert --seconds 20 [--off]   # one model's loop
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.fx.traceback as fx_traceback
from torch import nn

from gpudiag.analyzers.findings.debug_switches import RECORD_TO_WHOLE

RECORDED = [0.0]


def _timed_format_stack(orig):
    def format_stack():
        t0 = time.perf_counter()
        try:
            return orig()
        finally:
            RECORDED[0] += time.perf_counter() - t0

    return format_stack


def mlp():
    """The planted job's MLP: 8 blocks of Linear 128, GELU, LayerNorm; batch 32."""
    blocks = [nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.LayerNorm(128)) for _ in range(8)]
    model = nn.Sequential(*blocks, nn.Linear(128, 10))
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    return model, lambda: nn.functional.cross_entropy(model(x), y)


def lightning_transformer():
    """Lightning's demo Transformer, vocabulary 1000, 35 tokens, batch 8."""
    from lightning.pytorch.demos.transformer import Transformer

    model = Transformer(vocab_size=1000, nlayers=2, nhid=256, ninp=128, nhead=4)
    x = torch.randint(0, 1000, (8, 35))
    y = torch.randint(0, 1000, (8, 35))
    return model, lambda: nn.functional.nll_loss(model(x, y), y.view(-1))


def bert():
    """A 2-layer BERT from its config, 64 tokens, batch 8, masked-LM-like loss on the pooler."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=2000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
    )
    model = BertModel(cfg)
    ids = torch.randint(0, 2000, (8, 64))
    return model, lambda: model(input_ids=ids).last_hidden_state.pow(2).mean()


def convnet():
    """A small conv net on 32x32 images, batch 16."""
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    return model, lambda: nn.functional.cross_entropy(model(x), y)


MODELS = {
    "mlp": mlp,
    "lightning_transformer": lightning_transformer,
    "bert": bert,
    "convnet": convnet,
}


def block(step, opt, steps: int, anomaly: bool) -> tuple[float, float]:
    """Seconds per step and recorded seconds per step over `steps` steps."""
    torch.set_anomaly_enabled(anomaly)
    RECORDED[0] = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
        opt.zero_grad()
        loss.backward()
        opt.step()
    took = time.perf_counter() - t0
    torch.set_anomaly_enabled(False)
    return took / steps, RECORDED[0] / steps


def job(name: str, seconds: float, anomaly: bool) -> None:
    """One model's plain training loop for `seconds` (for gpudiag run and bare timing)."""
    model, step = MODELS[name]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.autograd.set_detect_anomaly(anomaly)
    t0, n = time.time(), 0
    while time.time() - t0 < seconds:
        loss = step()
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
    print(f"{name}: {n / (time.time() - t0):.2f} steps/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--job", choices=MODELS, help="run this model's training loop instead")
    ap.add_argument("--seconds", type=float, default=20.0, help="--job: how long")
    ap.add_argument("--off", action="store_true", help="--job: anomaly detection off")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if a.job:
        job(a.job, a.seconds, not a.off)
        return
    fx_traceback.format_stack = _timed_format_stack(fx_traceback.format_stack)
    print(f"RECORD_TO_WHOLE = {RECORD_TO_WHOLE} (DEBUG001's high end)")
    for name in a.models.split(","):
        model, step = MODELS[name]()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        block(step, opt, 3, False)
        on, off, rec = [], [], []
        for r in range(a.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            for anomaly in order:
                t, recorded = block(step, opt, a.steps, anomaly)
                (on if anomaly else off).append(t)
                if anomaly:
                    rec.append(recorded / t)
        t_on, t_off = statistics.median(on), statistics.median(off)
        record, whole = statistics.median(rec), 1.0 - t_off / t_on
        print(
            f"{name:22s} step on {t_on * 1e3:7.2f} ms off {t_off * 1e3:7.2f} ms "
            f"(x{t_on / t_off:.2f}); records {record:.1%} of the step, whole overhead "
            f"{whole:.1%}: ratio {whole / max(record, 1e-9):.1f}"
        )


if __name__ == "__main__":
    main()
