"""The starved-loader job, started without gpudiag, that calls instrument() for a later attach."""

from gpudiag.probes.hooks import instrument

instrument()

from _common import parse_args, small_cnn, train  # noqa: E402
from starved_loader import SlowAugment  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

if __name__ == "__main__":
    args = parse_args(__doc__)
    train(
        small_cnn(), lambda: DataLoader(SlowAugment(), batch_size=32, num_workers=0), args.seconds
    )
