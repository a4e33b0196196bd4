"""Planted IO001: every sample is read from storage with the page cache dropped first."""

import os
import sys
import tempfile

import torch
from _common import parse_args, small_cnn, train
from torch.utils.data import DataLoader, Dataset

SAMPLE_BYTES = 8 << 20


class UncachedFiles(Dataset):
    def __init__(self, folder, n):
        self.files = [os.path.join(folder, f"s{i}.bin") for i in range(n)]

    def __len__(self):
        return len(self.files) * 1000

    def __getitem__(self, i):
        fd = os.open(self.files[i % len(self.files)], os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # force a real disk read
            raw = os.read(fd, SAMPLE_BYTES)
        finally:
            os.close(fd)
        x = torch.frombuffer(bytearray(raw[: 3 * 32 * 32]), dtype=torch.uint8)
        return x.view(3, 32, 32).float() / 255, i % 10


def make_files(folder, n):
    for i in range(n):
        with open(os.path.join(folder, f"s{i}.bin"), "wb") as f:
            f.write(os.urandom(SAMPLE_BYTES))
            f.flush()
            os.fsync(f.fileno())


if __name__ == "__main__":
    args = parse_args(__doc__)
    with tempfile.TemporaryDirectory(prefix="gpudiag-io-", dir=os.environ.get("IO_DIR")) as d:
        make_files(d, 24)
        print("data ready", file=sys.stderr, flush=True)
        model = small_cnn(width=8)
        train(
            model,
            lambda: DataLoader(
                UncachedFiles(d, 24),
                batch_size=8,
                num_workers=2,
                shuffle=True,
                persistent_workers=True,
            ),
            args.seconds,
        )
