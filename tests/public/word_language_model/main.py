# BSD 3-Clause License. Copyright (c) 2017, the pytorch/examples contributors.
# Modelled on https://github.com/pytorch/examples/tree/77f55b912142e11fcfdf5b530231fb9c52f181e8/word_language_model
# (main.py, model.py, data.py: the Corpus of word ids with <eos>, batchify, the 2-layer LSTM
# RNNModel with tied-able decoder, truncated BPTT with repackage_hidden, clip_grad_norm_ and the
# hand-written SGD update, log every 200 batches, evaluate on valid after each epoch and torch.save
# the model when the valid loss improves). Changed for gpudiag's tests (tests/public/README.md):
# a synthetic corpus is written on the fly (no wikitext-2 download), vocabulary 2,000 words;
# time-bounded by PUBLIC_SECONDS; --no-checkpoint skips the best-model save.
"""pytorch/examples word_language_model (LSTM) on CPU with a synthetic corpus."""

import argparse
import math
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402


class Dictionary:
    def __init__(self):
        self.word2idx, self.idx2word = {}, []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus:
    def __init__(self, path):
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(path, "train.txt"))
        self.valid = self.tokenize(os.path.join(path, "valid.txt"))
        self.test = self.tokenize(os.path.join(path, "test.txt"))

    def tokenize(self, path):
        with open(path, encoding="utf8") as f:
            idss = []
            for line in f:
                words = line.split() + ["<eos>"]
                idss.append(torch.tensor([self.dictionary.add_word(w) for w in words]))
        return torch.cat(idss).type(torch.int64)


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (
            weight.new_zeros(self.nlayers, bsz, self.nhid),
            weight.new_zeros(self.nlayers, bsz, self.nhid),
        )


def write_corpus(path, vocab=2000, seed=0):
    g = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    for name, lines in (("train.txt", 4000), ("valid.txt", 300), ("test.txt", 300)):
        with open(os.path.join(path, name), "w", encoding="utf8") as f:
            for _ in range(lines):
                ids = g.zipf(1.3, size=g.integers(5, 30)) % vocab
                f.write(" ".join(words[i] for i in ids) + "\n")


parser = argparse.ArgumentParser(description="PyTorch Wikitext-2 RNN/LSTM Language Model")
parser.add_argument("--model", type=str, default="LSTM")
parser.add_argument("--emsize", type=int, default=200)
parser.add_argument("--nhid", type=int, default=200)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=20)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--batch_size", type=int, default=20)
parser.add_argument("--bptt", type=int, default=35)
parser.add_argument("--dropout", type=float, default=0.2)
parser.add_argument("--tied", action="store_true")
parser.add_argument("--seed", type=int, default=1111)
parser.add_argument("--log-interval", type=int, default=200)
parser.add_argument("--no-checkpoint", action="store_true", help="fix: no best-model save")
args = parser.parse_args()
torch.manual_seed(args.seed)
device = torch.device("cpu")
workdir = tempfile.TemporaryDirectory(prefix="wlm-")
write_corpus(workdir.name)
corpus = Corpus(workdir.name)
save_path = os.path.join(workdir.name, "model.pt")


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


eval_batch_size = 10
train_data = batchify(corpus.train, args.batch_size)
val_data = batchify(corpus.valid, eval_batch_size)
ntokens = len(corpus.dictionary)
model = RNNModel(
    args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied
).to(device)
criterion = nn.NLLLoss()


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].view(-1)


def evaluate(data_source):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train():
    model.train()
    total_loss = 0.0
    start_time = time.time()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        total_loss += loss.item()
        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            print(
                f"| epoch {epoch:3d} | {batch:5d} batches | lr {lr:02.2f} | "
                f"ms/batch {elapsed * 1000 / args.log_interval:5.2f} | loss {cur_loss:5.2f}"
            )
            total_loss = 0.0
            start_time = time.time()
        if clock.step():
            return True
    return False


lr = args.lr
best_val_loss = None
for epoch in range(1, args.epochs + 1):
    epoch_start_time = time.time()
    stop = train()
    val_loss = evaluate(val_data)
    print(f"| end of epoch {epoch:3d} | valid loss {val_loss:5.2f} | ppl {math.exp(val_loss):8.2f}")
    if not best_val_loss or val_loss < best_val_loss:
        if not args.no_checkpoint:
            with open(save_path, "wb") as f:
                torch.save(model, f)
        best_val_loss = val_loss
    else:
        lr /= 4.0
    if stop:
        break
