"""A call-site trial against the fix timed bare (issue 55): `gpudiag try --fix
thin:MODULE.FUNCTION:every=N` on a planted job, and the job's own fix flag timed bare, 3
interleaved rounds each (as is, fixed, fixed, as is, ...), medians compared.

Jobs (tests/workloads): `window_metric` (a rolling ROC AUC over a window of 40,000 scores
recomputed every step; bare fix `--metric-every 50`, trial thin:window_metric.rolling_auc:
every=50) and `metrics_post` (a blocking metrics POST every step; bare fix `--post-every 30`,
trial thin:metrics_post.push:every=30).

    python benchmarks/callsite_trial.py [--job window_metric] [--seconds 12] [--rounds 3]

Prints each arm's steps/s, the bare ratio (median fixed / median as is), the trial's
measured ratio and interval, and whether the trial is within 25% of the bare ratio. Timings:
run alone (nice off) and read /proc/loadavg beside the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "window_metric": (["--metric-every", "50"], "thin:window_metric.rolling_auc:every=50"),
    "metrics_post": (["--post-every", "30"], "thin:metrics_post.push:every=30"),
}


def bare(job: str, flags: list[str], seconds: float) -> float:
    """Steps per second of one bare run (the job's own count over its seconds)."""
    script = ROOT / "tests" / "workloads" / f"{job}.py"
    out = subprocess.run(
        [sys.executable, str(script), "--seconds", str(seconds), *flags],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        check=True,
    ).stdout
    m = re.search(r"steps: (\d+) in ([\d.]+) s", out)
    if not m:
        raise SystemExit(f"{job}: no step count in its output: {out[-200:]!r}")
    return int(m.group(1)) / float(m.group(2))


def trial(job: str, fix: str, seconds: float, rounds: int) -> dict:
    """`gpudiag try` of the fix: its trials entry."""
    script = ROOT / "tests" / "workloads" / f"{job}.py"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "t.json"
        subprocess.run(
            [sys.executable, "-m", "gpudiag.agent.cli.main", "try", "--fix", fix]
            + ["--rounds", str(rounds), "--seconds", str(seconds), "--warmup", "3"]
            + ["--out", str(out), "--", sys.executable, str(script), "--seconds", "600"],
            timeout=rounds * 2 * (seconds + 150),
            check=False,
        )
        return json.loads(out.read_text())["trials"][0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", choices=sorted(JOBS), default="window_metric")
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    flags, fix = JOBS[args.job]
    base, fixed = [], []
    for r in range(args.rounds):
        for arm in ("A", "B") if r % 2 == 0 else ("B", "A"):
            rate = bare(args.job, flags if arm == "B" else [], args.seconds)
            (fixed if arm == "B" else base).append(rate)
            print(f"bare round {r + 1} {'fixed' if arm == 'B' else 'as is'}: {rate:.2f}/s")
    ratio = statistics.median(fixed) / statistics.median(base)
    t = trial(args.job, fix, args.seconds, args.rounds)
    print(f"bare: x{ratio:.2f} (as is {base}, fixed {fixed})")
    lo, hi = t.get("interval") or (None, None)
    print(f"try {fix}: x{t['measured']} [{lo}, {hi}] ({t['verdict']}); applied: {t['applied']}")
    if t.get("measured"):
        off = t["measured"] / ratio - 1
        print(f"trial vs bare: {off:+.0%} ({'within' if abs(off) <= 0.25 else 'outside'} ±25%)")
    print(f"load: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
