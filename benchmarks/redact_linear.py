"""Redaction runs in time linear in its input: time per byte from 1 KB to 2 MB, on the text
shapes that made the old rules quadratic (review adversarial-6, X03), as a ratio in one run.

    python benchmarks/redact_linear.py            # prints a table; exit 1 if a ratio > --max-ratio

`_redact` (every rule, no cut) is timed, so the figure is the matching itself; `redact_text`
also cuts at MAX_TEXT_CHARS, so its time at 2 MB is that of 64 KB.
"""

from __future__ import annotations

import argparse
import sys
import time

from gpudiag.text.redact import _redact, redact_argv, redact_text

SHAPES = {
    "dotted name": "a.",
    "url scheme run": "a+",
    "jwt heads": "eyJ-",
    "mysql words": "mysql ",
    "quoted pairs": '"a": ',
    "name: pairs": "a: ",
    "secret options": "--token ",
    "plain words": "step loss ",
}
SIZES = (1024, 16 * 1024, 256 * 1024, 2 * 1024 * 1024)


def per_byte(fn, text: str, repeats: int) -> float:
    """The best of `repeats` runs, in nanoseconds of this thread's CPU time per byte (CPU
    time: on a busy box another process's turn is not counted)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        fn(text)
        best = min(best, time.thread_time() - t0)
    return best / len(text) * 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--max-ratio", type=float, default=2.0, help="2 MB over 1 KB, per byte (quadratic: 2048)"
    )
    args = ap.parse_args(argv)
    worst = 0.0
    print(f"{'shape':16} " + " ".join(f"{s // 1024:>8} KB" for s in SIZES) + "   ratio  (ns/B)")
    for name, unit in SHAPES.items():
        row = []
        for size in SIZES:
            text = (unit * (size // len(unit) + 1))[:size]
            row.append(per_byte(_redact, text, 5 if size <= 16384 else 2))
        ratio = row[-1] / row[0]
        worst = max(worst, ratio)
        print(f"{name:16} " + " ".join(f"{v:11.0f}" for v in row) + f"   {ratio:5.2f}")
    big = "a." * (1024 * 1024)
    t0 = time.perf_counter()
    redact_text(big)
    redact_argv([big] * 15)
    print(f"redact_text + redact_argv of 15 x 2 MB (cut): {time.perf_counter() - t0:.3f} s")
    print(f"worst ratio {worst:.2f} (limit {args.max_ratio})")
    return 0 if worst <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
