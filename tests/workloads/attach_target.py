"""The starved-loader job (DATA001), started without gpudiag, for `attach --hooks`:
`attach_target.py SECONDS FILE` writes each optimizer step's Unix time to FILE at the end.
It makes FILE.ready at its first step, and stops early once FILE.stop exists."""

import json
import os
import sys
import time

import torch
from _common import small_cnn, train
from starved_loader import SlowAugment
from torch.utils.data import DataLoader

if __name__ == "__main__":
    seconds, path = float(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    times: list[float] = []

    class Stop(Exception):
        pass

    def after_step(step: int) -> None:
        times.append(time.time())
        if step == 1:
            open(path + ".ready", "w").close()
        if os.path.exists(path + ".stop"):
            raise Stop

    try:
        train(
            small_cnn(),
            lambda: DataLoader(SlowAugment(), batch_size=32, num_workers=0),
            seconds,
            after_step=after_step,
        )
    except Stop:
        pass
    with open(path, "w") as f:
        json.dump(times, f)
