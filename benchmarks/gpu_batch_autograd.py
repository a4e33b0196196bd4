"""On a GPU: items/s of the planted server's 2-layer transformer (tests/workloads/serve_http.py,
built from its config) by batch size, with autograd on and under torch.inference_mode():
what batching (SERVE001, INFER002) and inference mode (INFER001) give where a batch costs
about one forward. Each cell: the median of --rounds timed blocks of --forwards forwards,
the arms alternated.

    python benchmarks/gpu_batch_autograd.py --batches 1 8 64 --rounds 5 --forwards 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "workloads"))
from serve_http import TinyTransformer  # noqa: E402


def block(model, x, grad: bool, n: int) -> float:
    """Items per second over n forwards of x."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        if grad:
            model(x)
        else:
            with torch.inference_mode():
                model(x)
    torch.cuda.synchronize()
    return n * x.shape[0] / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--forwards", type=int, default=200)
    args = p.parse_args()
    torch.manual_seed(0)
    model = TinyTransformer().eval().cuda()
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    base = None
    for bs in args.batches:
        x = torch.randint(0, 1000, (bs, 32), device="cuda")
        block(model, x, True, 20)
        block(model, x, False, 20)  # warm-up
        on, off = [], []
        for _ in range(args.rounds):
            on.append(block(model, x, True, args.forwards))
            off.append(block(model, x, False, args.forwards))
        a, b = statistics.median(on), statistics.median(off)
        base = base or a
        print(
            f"batch {bs}: autograd on {a:,.0f} items/s, inference mode {b:,.0f} items/s "
            f"(x{b / a:.2f}); vs batch {args.batches[0]} with autograd x{a / base:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
