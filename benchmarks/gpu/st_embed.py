"""A sentence-transformers embedding job: encode a corpus, one `model.encode(sentence)` call per
sentence (the pattern of many tutorials and answers), or with --batch-size N one
`model.encode(chunk, batch_size=N)` per chunk (the library's documented use). The model is a
BERT-base-sized encoder built from its config (random weights, no network) + mean pooling.
Prints ITEMS_PER_S over the steady part."""

import argparse
import os
import random
import time

import torch
from sentence_transformers import SentenceTransformer, models
from transformers import BertConfig, BertModel, BertTokenizerFast

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=20)
ap.add_argument("--batch-size", type=int, default=0, help="0: one encode() per sentence")
ap.add_argument("--model-dir", default="/tmp/st_bert")
ap.add_argument("--device", default="cuda")
a = ap.parse_args()

WORDS = [f"w{i}" for i in range(5000)]
if not os.path.exists(os.path.join(a.model_dir, "config.json")):
    os.makedirs(a.model_dir, exist_ok=True)
    vocab = os.path.join(a.model_dir, "vocab.txt")
    with open(vocab, "w") as f:
        f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    BertTokenizerFast(vocab_file=vocab).save_pretrained(a.model_dir)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=5005)).save_pretrained(a.model_dir)

word = models.Transformer(a.model_dir, max_seq_length=128)
pool = models.Pooling(word.get_word_embedding_dimension(), "mean")
model = SentenceTransformer(modules=[word, pool], device=a.device)
rng = random.Random(0)
corpus = [" ".join(rng.choices(WORDS, k=rng.randint(8, 40))) for _ in range(20000)]

n, t0, tw = 0, time.time(), None
i = 0
while time.time() - t0 < a.seconds:
    if a.batch_size:
        chunk = corpus[i % 20000 : i % 20000 + 2048]
        model.encode(chunk, batch_size=a.batch_size, show_progress_bar=False)
        n += len(chunk)
        i += 2048
    else:
        model.encode(corpus[i % 20000])
        n += 1
        i += 1
    if tw is None and time.time() - t0 > 3:
        tw, nw = time.time(), n
if tw is None:
    tw, nw = t0, 0
print(f"ITEMS {n} ITEMS_PER_S {(n - nw) / (time.time() - tw):.2f}", flush=True)
