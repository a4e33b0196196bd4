"""Planted HOST001 (user code): an inference loop with no optimizer that tokenizes each batch in
pure Python on the loop thread; the model's forward is a small part of each iteration."""

import random
import time

import torch
from _common import parse_args
from torch import nn

WORDS = [f"w{i}" for i in range(2000)]
VOCAB = {w: i for i, w in enumerate(WORDS)}


def tokenize(texts: list[str], length: int = 64) -> torch.Tensor:
    """A slow, pure-Python tokenizer: split, normalise, look up, pad."""
    rows = []
    for text in texts:
        ids = []
        for word in text.split():
            word = word.strip(".,;:!?").lower()
            for _ in range(3):  # a normalisation chain, as real tokenizers have
                word = word.replace("--", "-").strip("-")
            ids.append(VOCAB.get(word, 0))
        rows.append((ids + [0] * length)[:length])
    return torch.tensor(rows)


if __name__ == "__main__":
    args = parse_args(__doc__)
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(60)) for _ in range(512)]
    model = nn.Sequential(nn.Embedding(2000, 32), nn.Flatten(), nn.Linear(64 * 32, 10)).eval()
    t0 = time.time()
    batches = 0
    with torch.no_grad():
        while time.time() - t0 < args.seconds:
            texts = rng.sample(corpus, 64)
            logits = model(tokenize(texts))
            batches += 1
    print(f"batches: {batches} in {time.time() - t0:.1f} s", flush=True)
