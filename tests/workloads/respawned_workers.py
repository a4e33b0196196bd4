"""Planted DATA003: persistent_workers=False and a costly per-worker initialisation (a lookup
table built in every worker): each short epoch starts its workers again and the loop waits
for them (--fix: persistent_workers=True)."""

import sys

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Tabled(Dataset):
    """A small epoch whose samples read a table each worker builds once at its start."""

    def __init__(self) -> None:
        self.table = None

    def __len__(self):
        return 32 * 30

    def __getitem__(self, i):
        return self.table[i % 1000].reshape(3, 32, 32), i % 10


def build_table(_worker_id: int) -> None:
    """The per-worker set-up (a vocabulary, an index, a decoder): about a second of CPU."""
    ds = get_worker_info().dataset
    table = torch.rand(1000, 3 * 32 * 32)
    for _ in range(3):
        table = torch.tanh(table @ torch.rand(3 * 32 * 32, 3 * 32 * 32) / 100)
    ds.table = table


if __name__ == "__main__":
    fix = "--fix" in sys.argv
    if fix:
        sys.argv.remove("--fix")
    args = parse_args(__doc__)
    model = small_cnn()
    loader = DataLoader(
        Tabled(),
        batch_size=32,
        num_workers=2,
        worker_init_fn=build_table,
        persistent_workers=fix,
    )
    train(model, lambda: loader, args.seconds)
