# Apache License 2.0. Copyright 2020-2026 The HuggingFace Team.
# Runs TRL's own supervised fine-tuning script, `trl/scripts/sft.py` of trl 1.16.0 (PyPI; the
# file as installed, imported and called unchanged: its parser and its main()), with the
# command of its "Full training" docstring (the README command):
#   --model_name_or_path Qwen/Qwen2-0.5B --dataset_name trl-lib/Capybara --learning_rate 2.0e-5
#   --num_train_epochs 1 --packing --per_device_train_batch_size 2
#   --gradient_accumulation_steps 8 --eos_token '<|im_end|>' --eval_strategy steps
#   --eval_steps 100 --output_dir Qwen2-0.5B-SFT --push_to_hub
# SFTConfig's own default `gradient_checkpointing=True` (TRL's, not transformers') is in force:
# the command does not name it. Changed for gpudiag's tests (tests/public/README.md): no Hub:
# the model is a Qwen2 of Qwen2-0.5B's shape scaled down (4 layers, hidden 256, random
# weights), its tokenizer a byte-level BPE of 2,048 tokens trained here with ChatML's
# special tokens and a ChatML chat template, the dataset a Capybara-like conversation set
# ("messages": a question and its answer) made from the standard library's docstrings and
# written as JSON lines (train/test), all made on the first run and kept in a temp dir; no
# --push_to_hub; use_cpu; --max_length 256 (of 1024) and --gradient_accumulation_steps 2 (of 8)
# so that a step takes about a second on 2 cores. Time-bounded by PUBLIC_SECONDS (a
# TrainerCallback added to SFTTrainer stops training; stepclock.py).
# The fix flag is the script's own: `--gradient_checkpointing False`.
"""TRL's sft.py as its docstring runs it, on a small Qwen2 made here, on the CPU."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402

ASSETS = os.path.join(tempfile.gettempdir(), "gpudiag-public-trl-sft-1")
MODULES = (
    "argparse ast asyncio base64 bisect calendar collections configparser contextlib copy csv "
    "dataclasses datetime decimal difflib email enum fractions functools glob gzip hashlib heapq "
    "html http.client inspect io ipaddress itertools json logging math mimetypes operator os "
    "pathlib pickle pprint queue random re sched secrets shlex shutil socket sqlite3 statistics "
    "string struct subprocess tarfile tempfile textwrap threading timeit tokenize traceback "
    "typing unittest urllib.parse urllib.request uuid warnings weakref zipfile zlib"
).split()
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def conversations() -> list[dict]:
    """A question about each documented standard-library callable and its docstring."""
    rows = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr, obj in sorted(vars(mod).items()):
            doc = inspect.getdoc(obj) if callable(obj) and not attr.startswith("_") else None
            if doc and len(doc) > 40:
                rows.append(
                    {
                        "messages": [
                            {"role": "user", "content": f"What does {name}.{attr} do?"},
                            {"role": "assistant", "content": doc[:2000]},
                        ]
                    }
                )
    return rows


def make_assets(path: str) -> None:
    """The tokenizer, the model and the dataset, written to `path` once."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    rows = conversations()
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    texts = [m["content"] for r in rows for m in r["messages"]]
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2048, special_tokens=special))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = CHATML
    model_dir = os.path.join(tmp, "model")
    tok.save_pretrained(model_dir)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    for split, part in (("train", rows[: len(rows) - 64]), ("test", rows[-64:])):
        with open(os.path.join(data_dir, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
    try:
        os.rename(tmp, path)
    except OSError:  # another run made them first
        shutil.rmtree(tmp, ignore_errors=True)


def readme_argv(assets: str, out: str) -> list[str]:
    """The docstring's command, with this box's model, data, sizes and output."""
    return [
        "--model_name_or_path", os.path.join(assets, "model"),
        "--dataset_name", os.path.join(assets, "data"),
        "--learning_rate", "2.0e-5",
        "--num_train_epochs", "1",
        "--packing",
        "--per_device_train_batch_size", "2",
        "--gradient_accumulation_steps", "2",
        "--eos_token", "<|im_end|>",
        "--eval_strategy", "steps",
        "--eval_steps", "100",
        "--output_dir", out,
        "--max_length", "256",
        "--use_cpu", "True",
        "--bf16", "False",
        "--report_to", "none",
    ]  # fmt: skip


def main() -> None:
    warnings.filterwarnings("ignore")
    if not os.path.isdir(ASSETS):
        make_assets(ASSETS)
    import trl
    from transformers import TrainerCallback
    from trl.scripts import sft

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if clock.step():
                control.should_training_stop = True

    class ClockedSFTTrainer(trl.SFTTrainer):  # sft.main() builds `trl.SFTTrainer`
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.add_callback(Clock())

    trl.SFTTrainer = ClockedSFTTrainer
    out = tempfile.mkdtemp(prefix="trl-sft-")
    try:
        argv = readme_argv(ASSETS, out) + sys.argv[1:]
        parsed = sft.make_parser().parse_args_and_config(argv)
        sft.main(*parsed[:4])
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
