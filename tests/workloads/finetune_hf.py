"""A sequence-classification fine-tuning loop written the way Hugging Face's examples prepare
their data without Trainer: the texts tokenized once (`dataset.map`), padded there to a fixed
length (`padding="max_length"`, run_glue.py's default) or left unpadded and padded per batch
by the collator (`DataCollatorWithPadding`: each batch to its longest row), a DataLoader, a
model called with `model(**batch)`, loss.backward(), AdamW. The model is a small BERT built
from its config (no weights downloaded); the tokenizer a whitespace one with a fast
tokenizer's outputs (input_ids, attention_mask).

    python finetune_hf.py --seconds 20 --pad-max 128   # every row padded to 128 tokens
    python finetune_hf.py --seconds 20                 # each batch to its longest row
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification

VOCAB = 2000


def tokenize(sentence: str, max_length: int, pad_max: bool) -> dict[str, list[int]]:
    """One row: ids and mask, padded to `max_length` with `pad_max` (truncated to it)."""
    row = [101] + [hash(w) % (VOCAB - 200) + 200 for w in sentence.split()][: max_length - 2]
    row = row + [102]
    pad = max_length - len(row) if pad_max else 0
    return {"input_ids": row + [0] * pad, "attention_mask": [1] * len(row) + [0] * pad}


def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
    """DataCollatorWithPadding's result: every row to the batch's longest (already equal
    when the dataset was padded to a fixed length, as default_data_collator takes them)."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = [r["input_ids"] + [0] * (width - len(r["input_ids"])) for r in rows]
    mask = [r["attention_mask"] + [0] * (width - len(r["attention_mask"])) for r in rows]
    return {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.tensor(mask),
        "labels": torch.tensor([r["label"] for r in rows]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--pad-max", type=int, default=0, help='padding="max_length" to this')
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
        num_labels=2,
    )
    model = BertForSequenceClassification(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    texts = [" ".join(rng.choices(words, k=rng.randint(8, 30))) for _ in range(2048)]
    data = [
        tokenize(t, args.pad_max or 512, bool(args.pad_max)) | {"label": i % 2}
        for i, t in enumerate(texts)
    ]
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, collate_fn=collate)
    t0, steps = time.time(), 0
    while time.time() - t0 < args.seconds:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if time.time() - t0 >= args.seconds:
                break
    took = time.time() - t0
    print(f"trained {steps} steps in {took:.1f} s: {steps / took:.2f}/s", flush=True)


if __name__ == "__main__":
    main()
