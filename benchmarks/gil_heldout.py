"""Held-out GIL contention: tests/workloads/gil_mlp.py under `run` and `attach`, 15 s looks.

For each kind of helper thread (and a healthy control) and each mode, N times, on this box as
it is (add --burn to run a second process spinning on one core): print the top finding of
each look and how often it is the expected one (GIL001 for contention, no GIL001 otherwise).

    python benchmarks/gil_heldout.py --n 3 [--burn] [--kinds dict:3,log:3,pool:4,sleep:3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WORKLOAD = os.path.join(os.path.dirname(__file__), "..", "tests", "workloads", "gil_mlp.py")
CONTENTION = ("dict", "log", "pool")


def look(mode: str, kind: str, n: int, seconds: float, out: str) -> dict:
    """One 15 s look; the report as a dict."""
    job = [sys.executable, WORKLOAD, "--seconds", "60", "--kind", kind, "--competitors", str(n)]
    gd = [os.path.join(os.path.dirname(sys.executable), "gpudiag"), mode]
    common = ["--duration", str(seconds), "--out", out, "-q"]
    if mode == "run":
        subprocess.run(gd + common + ["--", *job], capture_output=True, timeout=300)
    else:
        p = subprocess.Popen(job, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(6)  # start-up: the loop is running when a user attaches
            subprocess.run(gd + [str(p.pid)] + common, capture_output=True, timeout=300)
        finally:
            p.kill()
            p.wait()
    with open(out) as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--burn", action="store_true", help="a second process burns one core")
    ap.add_argument("--kinds", default="dict:1,dict:3,dict:8,log:3,pool:4,sleep:3,native:2")
    ap.add_argument("--modes", default="run,attach")
    a = ap.parse_args()
    burn = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if a.burn else None
    tmp = tempfile.mkdtemp(prefix="gil-heldout-")
    try:
        for spec in a.kinds.split(","):
            kind, n = spec.split(":")
            for mode in a.modes.split(","):
                tops, right = [], 0
                for i in range(a.n):
                    rep = look(mode, kind, int(n), a.seconds, os.path.join(tmp, f"{i}.json"))
                    fs = [f for f in rep["findings"] if f["severity"] in ("error", "warning")]
                    top = fs[0]["id"] if fs else None
                    ok = (
                        (top == "GIL001")
                        if kind in CONTENTION
                        else ("GIL001" not in {f["id"] for f in fs})
                    )
                    right += ok
                    sure = rep.get("verdict", {}).get("sure")
                    tops.append(f"{top}{'' if sure else '?'}")
                print(
                    f"{kind}:{n} {mode:6} {right}/{a.n} right  tops: {' '.join(map(str, tops))}",
                    flush=True,
                )
    finally:
        if burn is not None:
            burn.kill()
            burn.wait()


if __name__ == "__main__":
    main()
