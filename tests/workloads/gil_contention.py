"""Planted GIL001: a pure-Python metrics thread holds the GIL and starves the training loop."""

import threading

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, TensorDataset


def summarise_metrics(stop):
    """A 'metrics aggregator' written in pure Python: it never releases the GIL for long."""
    window = list(range(5000))
    while not stop.is_set():
        total = 0
        for v in window:
            total += v * v % 7


if __name__ == "__main__":
    args = parse_args(__doc__)
    stop = threading.Event()

    def start_metrics(step):
        if step == 1:  # the aggregator starts with training, as a metrics thread would
            for i in range(2):
                threading.Thread(
                    target=summarise_metrics, args=(stop,), name=f"metrics-{i}", daemon=True
                ).start()

    data = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))
    model = small_cnn()
    train(
        model,
        lambda: DataLoader(data, batch_size=32, shuffle=True),
        args.seconds,
        after_step=start_metrics,
    )
    stop.set()
