# Apache License 2.0. Copyright 2020 The HuggingFace Inc. team.
# Modelled on https://github.com/huggingface/transformers/blob/main/examples/pytorch/text-classification/run_glue.py
# and the Trainer docs' on-the-fly tokenisation (a data collator that tokenises each batch
# of raw text with padding and truncation, instead of a pre-tokenised dataset.map): a
# BERT sequence classifier trained with Trainer and TrainingArguments (logging_steps, the
# default DataLoader with dataloader_num_workers=0). Changed for gpudiag's tests
# (tests/public/README.md): no Hub download: a tiny BertConfig and a BertTokenizer (the Python
# tokenizer) over a word-piece vocabulary written on the fly, random sentences as the data;
# CPU; time-bounded by PUBLIC_SECONDS (a TrainerCallback stops training);
# --workers N is one fix: dataloader_num_workers=N; --pretokenize the other: the text is
# tokenised once before training (run_glue.py's own `raw_datasets.map(preprocess_function,
# batched=True)`) and the collator only stacks tensors.
"""A Hugging Face Trainer text-classification run that tokenises each batch on the fly."""

import argparse
import os
import random
import sys
import tempfile
import warnings

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertTokenizer,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402

WORDS = [
    "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3 + i % 7))
    for i in range(3000)
]


class TextDataset(torch.utils.data.Dataset):
    """Raw sentences and labels, as a loaded CSV/JSON text-classification set gives them."""

    def __init__(self, n=20000, seed=0):
        self.n, self.seed = n, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        r = random.Random(self.seed * 1_000_003 + i)
        text = " ".join(r.choice(WORDS) for _ in range(r.randint(40, 120)))
        return {"sentence": text, "label": r.randint(0, 1)}


class Collator:
    """On-the-fly tokenisation: each batch of raw text is tokenised when it is loaded."""

    def __init__(self, tokenizer, max_seq_length=128):
        self.tokenizer, self.max_seq_length = tokenizer, max_seq_length

    def __call__(self, examples):
        batch = self.tokenizer(
            [e["sentence"] for e in examples],
            padding="max_length",
            max_length=self.max_seq_length,
            truncation=True,
            return_tensors="pt",
        )
        batch["labels"] = torch.tensor([e["label"] for e in examples])
        return batch


class Pretokenized(torch.utils.data.Dataset):
    """The dataset tokenised once up front, as run_glue.py's `dataset.map` does (the first n
    samples, enough for a time-bounded run, cycled)."""

    def __init__(self, tokenizer, n=4096, max_seq_length=128):
        raw = TextDataset()
        rows = [raw[i] for i in range(n)]
        enc = tokenizer(
            [r["sentence"] for r in rows],
            padding="max_length",
            max_length=max_seq_length,
            truncation=True,
            return_tensors="pt",
        )
        self.rows = [
            {**{k: v[i] for k, v in enc.items()}, "labels": torch.tensor(rows[i]["label"])}
            for i in range(n)
        ]

    def __len__(self):
        return 20000

    def __getitem__(self, i):
        return self.rows[i % len(self.rows)]


class TimeLimit(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if clock.step():
            control.should_training_stop = True


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=0, help="fix: dataloader_num_workers")
    ap.add_argument("--pretokenize", action="store_true", help="fix: tokenise once, up front")
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="hf-trainer-") as d:
        vocab = os.path.join(d, "vocab.txt")
        with open(vocab, "w") as f:
            specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            pieces = sorted({w[:3] for w in WORDS} | {"##" + w[3:] for w in WORDS if w[3:]})
            f.write("\n".join(specials + pieces) + "\n")
        tokenizer = BertTokenizer(vocab)
        config = BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            num_labels=2,
        )
        model = BertForSequenceClassification(config)
        training_args = TrainingArguments(
            output_dir=d,
            per_device_train_batch_size=args.batch_size,
            num_train_epochs=3,
            logging_steps=10,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            dataloader_num_workers=args.workers,
            remove_unused_columns=False,
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=Pretokenized(tokenizer) if args.pretokenize else TextDataset(),
            data_collator=None if args.pretokenize else Collator(tokenizer),
            callbacks=[TimeLimit()],
        )
        trainer.train()


if __name__ == "__main__":
    main()
