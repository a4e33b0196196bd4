"""The bounded capture turns itself off: the job's speed after the capture equals before.

Runs tests/workloads/capture_job.py with gpudiag's hooks sending to a live socket and a
capture of N steps after step K, in fresh processes, and compares the median step time of
the steps before the capture with those after it (the first steps and the steps next to the
window left out). A control round without a capture gives the noise of the same comparison.

    python benchmarks/capture_overhead.py --rounds 3 --steps 600 --after 200 --capture 10
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gpudiag.probes.inprocess.channel import injection_env

JOB = Path(__file__).resolve().parents[1] / "tests" / "workloads" / "capture_job.py"
SKIP = 20  # steps left out at the start and on each side of the window


def one_round(steps: int, after: int, capture: int) -> tuple[float, float, bool]:
    """Median step time before and after the window (s), and whether the profiler was on."""
    folder = tempfile.mkdtemp(prefix="gpudiag-bench-")
    path = os.path.join(folder, "hooks.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    env = injection_env(dict(os.environ), path)
    if capture:
        env.update(GPUDIAG_CAPTURE_STEPS=str(capture), GPUDIAG_CAPTURE_AFTER=str(after))
    try:
        out = subprocess.run(
            [sys.executable, str(JOB), str(steps)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        ).stdout
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(folder)
    job = json.loads(out.strip().splitlines()[-1])
    t = job["step_times"]
    before = t[SKIP : after - 1]
    later = t[after + capture + SKIP :]
    return statistics.median(before), statistics.median(later), job["profiler_on"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--after", type=int, default=200)
    ap.add_argument("--capture", type=int, default=10)
    a = ap.parse_args()
    for label, n in (("with capture", a.capture), ("control (no capture)", 0)):
        ratios = []
        for _ in range(a.rounds):
            b, later, on = one_round(a.steps, a.after, n)
            ratios.append(later / b)
            print(
                f"{label}: before {b * 1e3:.3f} ms/step, after {later * 1e3:.3f} ms/step, "
                f"ratio {later / b:.3f}, profiler on after: {on}"
            )
        print(f"{label}: median after/before {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
