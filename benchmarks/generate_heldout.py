"""A held-out job: text generation one prompt at a time, as Hugging Face's docs' loop does
(`model.generate(input_ids, max_new_tokens=...)` per prompt), on a small GPT-2 built from its
config (no network here). `--batch N` passes N prompts a call, left-padded, as the docs'
batched generation does. Prints prompts/s over the same prompts whatever the batch
(`--prompts N`).

    pip install torch==2.13.0 transformers
    python benchmarks/generate_heldout.py --prompts 48 [--batch 8]
"""

from __future__ import annotations

import argparse
import sys
import time


def _prompts(n: int):
    import torch

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 40, (n,), generator=g)
    return [torch.randint(1, 8000, (int(k),), generator=g) for k in lengths]


def _left_padded(chunk):
    import torch

    width = max(len(x) for x in chunk)
    pad = [width - len(x) for x in chunk]
    ids = torch.stack(
        [torch.cat([torch.zeros(p, dtype=torch.long), x]) for p, x in zip(pad, chunk, strict=True)]
    )
    mask = torch.stack(
        [
            torch.cat([torch.zeros(p, dtype=torch.long), torch.ones(len(x), dtype=torch.long)])
            for p, x in zip(pad, chunk, strict=True)
        ]
    )
    return ids, mask


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1, help="prompts per generate() call")
    p.add_argument("--prompts", type=int, default=0, help="stop after N prompts (0: by time)")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--new-tokens", type=int, default=24)
    args = p.parse_args()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8000)
    model = GPT2LMHeadModel(config).eval()
    prompts = _prompts(4096)
    t0, n = time.time(), 0
    while time.time() - t0 < args.seconds and (not args.prompts or n < args.prompts):
        chunk = [prompts[(n + k) % len(prompts)] for k in range(args.batch)]
        ids, mask = _left_padded(chunk)
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        n += len(chunk)
    took = time.time() - t0
    print(f"generated for {n} prompts in {took:.1f} s: {n / took:.2f} prompts/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
