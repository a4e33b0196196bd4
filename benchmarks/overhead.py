"""Overhead of gpudiag on the job it watches: throughput of a healthy CPU job, A/B interleaved.

Runs tests/workloads/healthy.py (one torch thread) for --seconds, alternately alone, under
`gpudiag run` with the default (non-blocking) py-spy mode, and under `--blocking`; each run
prints its step count. Reports the median steps/s ratio of each profiled mode to the bare job.

    python benchmarks/overhead.py --rounds 3 --seconds 20
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = Path(__file__).resolve().parent.parent / "tests" / "workloads" / "healthy.py"


def steps_per_s(cmd: list[str]) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"steps: (\d+) in ([\d.]+) s", out)
    if not m:
        raise SystemExit(f"no step count in output of {cmd}:\n{out}")
    return int(m.group(1)) / float(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    job = [sys.executable, str(JOB), "--seconds", str(args.seconds), "--threads", "1"]
    modes = {"bare": [], "nonblocking": ["--"], "blocking": ["--blocking", "--"]}
    results: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode, extra in modes.items():
                if mode == "bare":
                    cmd = job
                else:
                    cmd = [
                        sys.executable,
                        "-m",
                        "gpudiag.agent.cli.main",
                        "run",
                        "-q",
                        "--out",
                        f"{tmp}/r{r}-{mode}.json",
                        *extra,
                        *job,
                    ]
                results[mode].append(steps_per_s(cmd))
                print(f"round {r + 1} {mode:<12} {results[mode][-1]:.2f} steps/s", flush=True)
    base = results["bare"]
    for mode in ("nonblocking", "blocking"):
        ratios = [m / b for m, b in zip(results[mode], base, strict=True)]
        print(
            f"{mode:<12} median throughput ratio {statistics.median(ratios):.3f} "
            f"(runs: {', '.join(f'{x:.3f}' for x in ratios)})"
        )


if __name__ == "__main__":
    main()
