"""A model server's own batching timed bare (no gpudiag): tests/workloads/serve_litserve.py
(or --script serve_bentoml.py) at batch 1 and with `--batching` (LitServe's docs'
max_batch_size=8, batch_timeout=0.01; BentoML's batchable=True, max_batch_size=8), interleaved
rounds, the same load client on 127.0.0.1 (--clients processes for --load seconds); the
client's rate and p50 of each, the ratio of the rates per round, and the box's load beside each.

    python benchmarks/serve_batching.py [--rounds 3 --clients 6 --load 10]
    python benchmarks/serve_batching.py --script serve_bentoml.py
    python benchmarks/serve_batching.py --script serve_bentoml.py --paired --rounds 4 --load 5

--paired keeps both servers up and turns the load from one to the other every --load seconds
(ABBA), so that a change in the box's load falls on both within a pair.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "tests" / "workloads"
sys.path.insert(0, str(ROOT / "benchmarks"))
from serve_look import stop_tree  # noqa: E402


def serve(batching: bool, script: str, seconds: float) -> tuple[subprocess.Popen, Path]:
    """One server started (its own session), with the file its port will be written to."""
    port = Path(tempfile.mkdtemp(prefix="serve-bare-")) / "port"
    flags = ["--batching"] if batching else []
    server = subprocess.Popen(
        [sys.executable, str(WORKLOADS / script), "--port-file", str(port)]
        + ["--seconds", str(seconds), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return server, port


def client(port: Path, clients: int, load_s: float, script: str) -> tuple[float, float]:
    """(requests/s, p50 ms) the load client read of `load_s` seconds against one server."""
    rows = ["--rows"] if script == "serve_bentoml.py" else []  # its API takes rows
    gen = [sys.executable, str(WORKLOADS / "load_gen.py"), "--port-file", str(port), *rows]
    out = subprocess.run(
        [*gen, "--clients", str(clients), "--seconds", str(load_s), "--procs"],
        capture_output=True,
        text=True,
        timeout=load_s + 180,
    ).stdout
    m = re.search(r"([\d.]+) req/s, p50 ([\d.]+) ms", out)
    if not m:
        raise SystemExit(f"no client summary: {out!r}")
    return float(m.group(1)), float(m.group(2))


def one(
    batching: bool, clients: int, load_s: float, script: str = "serve_litserve.py"
) -> tuple[float, float]:
    """(requests/s, p50 ms) the client read of one server's run."""
    server, port = serve(batching, script, load_s + 60)
    try:
        return client(port, clients, load_s, script)
    finally:
        stop_tree(server)


def paired(rounds: int, clients: int, load_s: float, script: str) -> list[float]:
    """Both servers up at once, the load turned from one to the other every `load_s` seconds
    in ABBA order (a drift in the box's load cancels within a pair): each pair's ratio."""
    both = [serve(b, script, rounds * 4 * (load_s + 3) + 120) for b in (False, True)]
    try:
        for _, port in both:
            client(port, 1, 1.0, script)  # up, and warmed by a request
        ratios = []
        for r in range(rounds):
            got: dict[bool, list[float]] = {False: [], True: []}
            for b in (False, True, True, False):
                before = os.getloadavg()[0]
                rate, p50 = client(both[b][1], clients, load_s, script)
                got[b].append(rate)
                print(
                    f"pair {r + 1} {'batching' if b else 'batch 1 '}: {rate:.1f} req/s, "
                    f"p50 {p50:.1f} ms (load {before:.1f}-{os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            ratios.append(sum(got[True]) / sum(got[False]))
        return ratios
    finally:
        for server, _ in both:
            stop_tree(server)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--load", type=float, default=10.0)
    p.add_argument("--script", default="serve_litserve.py", help="or serve_bentoml.py")
    p.add_argument(
        "--paired",
        action="store_true",
        help="both servers up, the load alternated ABBA every --load seconds (--rounds pairs)",
    )
    args = p.parse_args()
    if args.paired:
        ratios = paired(args.rounds, args.clients, args.load, args.script)
        print(f"batching / batch 1, rate: x{statistics.median(ratios):.2f} (pairs {ratios})")
        return 0
    ratios = []
    for r in range(args.rounds):
        got = {}
        for batching in (False, True):
            before = os.getloadavg()[0]
            got[batching] = one(batching, args.clients, args.load, args.script)
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
