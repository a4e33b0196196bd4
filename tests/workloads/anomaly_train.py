"""A training job that left `torch.autograd.set_detect_anomaly(True)` on, a debugging switch
people forget: every forward op records its Python stack, every backward checks each gradient
for NaN (DEBUG001). `--off` leaves it off: the fix.

    python anomaly_train.py --seconds 20 [--off]
"""

import sys

import torch
from _common import parse_args, train
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    off = "--off" in sys.argv
    if off:
        sys.argv.remove("--off")
    args = parse_args(__doc__)
    torch.autograd.set_detect_anomaly(not off)
    blocks = [nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.LayerNorm(128)) for _ in range(8)]
    model = nn.Sequential(*blocks, nn.Linear(128, 10))
    data = TensorDataset(torch.randn(2048, 128), torch.randint(0, 10, (2048,)))
    train(model, lambda: DataLoader(data, batch_size=32, shuffle=True), args.seconds)
