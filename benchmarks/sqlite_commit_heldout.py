"""A held-out cause: a batch-embedding job that stores each row in SQLite and commits after
every row (each commit syncs the journal to disk), as code that "saves as it goes" often does.
`--fixed` commits once per batch. A small BERT from its config (CPU), random token ids,
batches of 32. Prints rows/s over the same rows (`--rows N`).

    python benchmarks/sqlite_commit_heldout.py --rows 2048 [--fixed]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fixed", action="store_true", help="commit once per batch")
    p.add_argument("--rows", type=int, default=0, help="stop after N rows (0: by time)")
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=256, vocab_size=8000)  # fmt: skip
    model = BertModel(cfg).eval()
    db = sqlite3.connect(os.path.join(tempfile.mkdtemp(prefix="emb-"), "emb.db"))
    db.execute("CREATE TABLE emb (id INTEGER PRIMARY KEY, vec BLOB)")
    limit = args.rows or 10**9
    t0, n = time.time(), 0
    while n < limit and time.time() - t0 < args.seconds:
        ids = torch.randint(1, 8000, (32, 48))
        with torch.no_grad():
            vecs = model(input_ids=ids).last_hidden_state.mean(dim=1)
        for v in vecs:
            db.execute("INSERT INTO emb (vec) VALUES (?)", (v.numpy().tobytes(),))
            if not args.fixed:
                db.commit()
        db.commit()
        n += len(vecs)
    took = time.time() - t0
    print(f"stored {n} rows in {took:.1f} s: {n / took:.1f} rows/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
