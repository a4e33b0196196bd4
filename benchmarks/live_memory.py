"""The live agent's memory over a simulated day: samples of an eight-GPU job (the same mix
as synthetic_recording.py) fold into a live session's timeline as fast as they can be made,
with the analysis the live view runs every simulated minute. Prints resident memory as the
simulated hours pass and its growth after the first hour.

    python benchmarks/live_memory.py --hours 24

The timeline keeps at most `max_segments` time segments (neighbours merge past that), so its
memory must not grow with the run's length.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic_recording import second  # noqa: E402

from gpudiag.analyzers import analyze  # noqa: E402
from gpudiag.analyzers.timeline.timeline import Timeline  # noqa: E402
from gpudiag.probes.base import Sample  # noqa: E402


def main() -> None:
    """Run the simulated day and print memory per hour."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--starved-after-h", type=float, default=20.0)
    args = ap.parse_args()
    rng = random.Random(1)
    me = psutil.Process()
    tl = Timeline()
    t0 = 1.8e9
    started = time.monotonic()
    first_hour_mb = None
    for n in range(int(args.hours * 3600)):
        t = t0 + n
        batch = [
            s if s.t_ns else Sample(s.probe, int(t * 1e9), s.labels, s.values)
            for s in second(t, rng, n >= args.starved_after_h * 3600, n)
        ]
        tl.extend(batch)
        if n % 60 == 59:
            analyze(tl)  # the live view's refresh
        if n % 3600 == 3599:
            rss = me.memory_info().rss / 2**20
            first_hour_mb = first_hour_mb or rss
            print(
                f"{(n + 1) / 3600:4.0f} h  rss {rss:6.1f} MB  (+{rss - first_hour_mb:.1f} MB "
                f"since hour 1)  segments {len(tl.segments)}  "
                f"{time.monotonic() - started:.0f} s elapsed",
                flush=True,
            )
    a = analyze(tl)
    print("periods:", [(p["start_s"], p["finding"]) for p in a.periods][-6:])


if __name__ == "__main__":
    main()
