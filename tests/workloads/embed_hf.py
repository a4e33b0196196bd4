"""A sentence-embedding job written the way the Hugging Face model cards of
sentence-transformers models show it without that library (tokenize a batch, run the
model, mean-pool over the attention mask, normalise), over a corpus in batches of 32 as
SentenceTransformer.encode does. The model is a small BERT built from its config (no
weights downloaded); the tokenizer a whitespace one with the same outputs as a fast
tokenizer's (input_ids, attention_mask, padded).

    python embed_hf.py --seconds 20             # the model card's way: under torch.no_grad()
    python embed_hf.py --seconds 20 --grad      # the no_grad line left out (INFER001)
    python embed_hf.py --seconds 20 --pad-max 256   # padding="max_length", max_length=256
    python embed_hf.py --seconds 20 --reload    # the model loaded again for every batch
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

VOCAB = 2000


def tokenizer(
    sentences: list[str], max_length: int = 64, pad_max: bool = False
) -> dict[str, torch.Tensor]:
    """padding=True (or "max_length" with `pad_max`), truncation=True, return_tensors='pt':
    ids and the attention mask."""
    rows = [
        [101] + [hash(w) % (VOCAB - 200) + 200 for w in s.split()][: max_length - 2] + [102]
        for s in sentences
    ]
    width = max_length if pad_max else max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def mean_pooling(model_output, attention_mask):
    token_embeddings = model_output[0]
    input_mask_expanded = attention_mask.unsqueeze(-1).expand(token_embeddings.size()).float()
    return torch.sum(token_embeddings * input_mask_expanded, 1) / torch.clamp(
        input_mask_expanded.sum(1), min=1e-9
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--grad", action="store_true", help="leave out the model card's no_grad")
    p.add_argument("--pad-max", type=int, default=0, help='padding="max_length" to this')
    p.add_argument("--reload", action="store_true", help="from_pretrained for every batch")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=max(512, args.pad_max),
    )
    model = BertModel(cfg).eval()
    saved = tempfile.TemporaryDirectory()
    if args.reload:
        from transformers.utils import logging

        logging.disable_progress_bar()
        model.save_pretrained(saved.name)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    corpus = [" ".join(rng.choices(words, k=rng.randint(8, 40))) for _ in range(4096)]
    t0, items, kept = time.time(), 0, []
    while time.time() - t0 < args.seconds:
        for start in range(0, len(corpus), args.batch_size):
            sentences = corpus[start : start + args.batch_size]
            if args.reload:  # an embed() that loads its model, called once a batch
                model = BertModel.from_pretrained(saved.name).eval()
            if args.pad_max:
                encoded_input = tokenizer(sentences, args.pad_max, pad_max=True)
            else:
                encoded_input = tokenizer(sentences)
            if args.grad:
                model_output = model(**encoded_input)
            else:
                with torch.no_grad():
                    model_output = model(**encoded_input)
            emb = mean_pooling(model_output, encoded_input["attention_mask"])
            kept.append(F.normalize(emb, p=2, dim=1)[:, :4].detach())
            kept = kept[-64:]
            items += len(sentences)
            if time.time() - t0 >= args.seconds:
                break
    took = time.time() - t0
    print(f"embedded {items} sentences in {took:.1f} s: {items / took:.0f}/s", flush=True)


if __name__ == "__main__":
    main()
