"""Planted EVAL001: a full pass over a large held-out set every 10 training steps
(--fix: every 100 steps)."""

import torch
from _common import parse_args, small_cnn, train
from torch import nn


def evaluate(model: nn.Module, batches: list) -> float:
    """Accuracy over the held-out set, grad off and the model in eval mode."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in batches:
            correct += int((model(x).argmax(1) == y).sum())
    model.train()
    return correct / sum(len(y) for _, y in batches)


if __name__ == "__main__":
    import sys

    fix = "--fix" in sys.argv
    if fix:
        sys.argv.remove("--fix")
    args = parse_args(__doc__)
    every = 100 if fix else 10
    model = small_cnn()
    train_set = [(torch.rand(32, 3, 32, 32), torch.randint(0, 10, (32,))) for _ in range(50)]
    held_out = [(torch.rand(64, 3, 32, 32), torch.randint(0, 10, (64,))) for _ in range(40)]

    def after_step(step: int) -> None:
        if step % every == 0:
            evaluate(model, held_out)

    train(model, lambda: train_set, args.seconds, after_step)
