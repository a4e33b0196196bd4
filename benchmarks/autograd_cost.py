"""What autograd costs a forward that never meets a backward, by batch size: INFER001's range
checked. The same model in one process, forwards with autograd on and under
torch.inference_mode() alternated in blocks (a busy box's drift hits both arms alike),
the median time ratio of several rounds per batch size. Models: the embedding job's small
BERT (tests/workloads/embed_hf.py) and the planted server's 2-layer transformer
(tests/workloads/serve_http.py), both built from their configs, one torch thread.

    python benchmarks/autograd_cost.py --rounds 7 --forwards 20

Prints one line per model and batch: the ratio, the share of the forward autograd cost, and
INFER001's range (what the finding would say).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

WORKLOADS = Path(__file__).resolve().parent.parent / "tests" / "workloads"
sys.path.insert(0, str(WORKLOADS))

from embed_hf import VOCAB, BertConfig, BertModel, tokenizer  # noqa: E402
from serve_http import TinyTransformer  # noqa: E402

from gpudiag.analyzers.findings.serving import AUTOGRAD_COST, AUTOGRAD_FIXED_COST  # noqa: E402


def block(model, inputs: list, grad: bool) -> float:
    """Seconds a forward over `inputs`, autograd on or under inference mode."""
    t0 = time.perf_counter()
    for x in inputs:
        if grad:
            model(**x) if isinstance(x, dict) else model(x)
        else:
            with torch.inference_mode():
                model(**x) if isinstance(x, dict) else model(x)
    return (time.perf_counter() - t0) / len(inputs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--forwards", type=int, default=20)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 32])
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    corpus = [" ".join(rng.choices(words, k=rng.randint(8, 40))) for _ in range(256)]
    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
    )
    models = {
        "bert (embed_hf)": (
            BertModel(cfg).eval(),
            lambda bs, i: tokenizer(corpus[(i * bs) % 200 : (i * bs) % 200 + bs]),
        ),
        "transformer (serve_http)": (
            TinyTransformer().eval(),
            lambda bs, i: torch.randint(0, 1000, (bs, 32)),
        ),
    }
    for name, (model, make) in models.items():
        for bs in args.batches:
            inputs = [make(bs, i) for i in range(args.forwards)]
            ratios = [
                block(model, inputs, True) / block(model, inputs, False) for _ in range(args.rounds)
            ]
            ratio = statistics.median(ratios)
            print(
                f"{name}, batch {bs}: autograd on / inference mode x{ratio:.2f} "
                f"(rounds x{min(ratios):.2f}-x{max(ratios):.2f}): autograd "
                f"{1 - 1 / ratio:.0%} of the forward; INFER001's range "
                f"{AUTOGRAD_COST:.0%}-{AUTOGRAD_FIXED_COST:.0%}",
                flush=True,
            )


if __name__ == "__main__":
    main()
