"""LitServe's own batching timed bare (no gpudiag): tests/workloads/serve_litserve.py at batch
1 and with `--batching` (its docs' max_batch_size=8, batch_timeout=0.01), interleaved rounds,
the same load client on 127.0.0.1 (--clients processes for --load seconds); the client's rate
and p50 of each, the ratio of the rates per round, and the box's load beside each.

    python benchmarks/litserve_batching.py [--rounds 3 --clients 6 --load 10]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "tests" / "workloads"


def one(batching: bool, clients: int, load_s: float) -> tuple[float, float]:
    """(requests/s, p50 ms) the client read of one server's run."""
    tmp = Path(tempfile.mkdtemp(prefix="litserve-bare-"))
    port = tmp / "port"
    flags = ["--batching"] if batching else []
    server = subprocess.Popen(
        [sys.executable, str(WORKLOADS / "serve_litserve.py"), "--port-file", str(port)]
        + ["--seconds", str(load_s + 60), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        gen = [sys.executable, str(WORKLOADS / "load_gen.py"), "--port-file", str(port)]
        out = subprocess.run(
            [*gen, "--clients", str(clients), "--seconds", str(load_s), "--procs"],
            capture_output=True,
            text=True,
            timeout=load_s + 180,
        ).stdout
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    m = re.search(r"([\d.]+) req/s, p50 ([\d.]+) ms", out)
    if not m:
        raise SystemExit(f"no client summary: {out!r}")
    return float(m.group(1)), float(m.group(2))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--load", type=float, default=10.0)
    args = p.parse_args()
    ratios = []
    for r in range(args.rounds):
        got = {}
        for batching in (False, True):
            before = os.getloadavg()[0]
            got[batching] = one(batching, args.clients, args.load)
            rate, p50 = got[batching]
            print(
                f"round {r + 1} {'batching' if batching else 'batch 1 '}: {rate:.1f} req/s, "
                f"p50 {p50:.1f} ms (load {before:.1f}-{os.getloadavg()[0]:.1f})",
                flush=True,
            )
            time.sleep(1)
        ratios.append(got[True][0] / got[False][0])
    print(f"batching / batch 1, rate: x{statistics.median(ratios):.2f} (rounds {ratios})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
