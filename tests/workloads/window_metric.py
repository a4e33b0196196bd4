"""A training job that recomputes a metric over a window of recent predictions every step: a
rolling ROC AUC over the last `--window` scores, in the job's own Python (sorted and summed
again each step, though one batch in a few thousand changes). `--metric-every N` computes it
every N steps: the fix (as would an incremental or vectorised AUC)."""

import sys
from collections import deque

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, TensorDataset


def rolling_auc(window: deque) -> float:
    """ROC AUC of (score, label) pairs by ranks: the Mann-Whitney U statistic."""
    ranked = sorted(window)
    pos = rank_sum = 0
    for rank, (_score, label) in enumerate(ranked, 1):
        if label:
            pos += 1
            rank_sum += rank
    neg = len(ranked) - pos
    if not pos or not neg:
        return 0.5
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


if __name__ == "__main__":
    every, size = 1, 40000
    for flag in ("--metric-every", "--window"):
        if flag in sys.argv:
            i = sys.argv.index(flag)
            value = int(sys.argv[i + 1])
            del sys.argv[i : i + 2]
            every, size = (value, size) if flag == "--metric-every" else (every, value)
    args = parse_args(__doc__)
    data = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))
    model = small_cnn(width=8)
    window: deque = deque(((s, i % 2) for i, s in enumerate(torch.rand(size).tolist())), size)
    history: list[float] = []

    def after_step(step: int) -> None:
        scores = torch.rand(32).tolist()  # the batch's scores, as a logger collects them
        window.extend((s, i % 2) for i, s in enumerate(scores))
        if step % every == 0:
            history.append(rolling_auc(window))

    train(model, lambda: DataLoader(data, batch_size=32, shuffle=True), args.seconds, after_step)
