"""What `--otlp` adds to gpudiag's own cost: `gpudiag attach --duration S` on
benchmarks/light_job.py, alternately without and with `--otlp` to an OTLP/HTTP receiver this
script runs on 127.0.0.1 (it accepts and counts the posts), interleaved (the order alternates
each round); gpudiag's whole CPU (wait4's rusage: its threads and every py-spy) and peak RSS
per arm, and the with/without CPU ratio per round and its median.

    python benchmarks/otlp_cost.py --seconds 20 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_cost import _attach, _start_job  # noqa: E402  # the same attach and job


def receiver() -> tuple[ThreadingHTTPServer, list[str]]:
    """An OTLP/HTTP endpoint on 127.0.0.1 that answers 200 and records each post's path."""
    posts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802  # http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, posts


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    server, posts = receiver()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    arms = {"without": [], "with --otlp": ["--otlp", url]}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        job = _start_job(args.workers, (args.seconds + 15) * 2 * args.rounds + 60, 0)
        try:
            time.sleep(8)  # past start-up: the job is training
            for r in range(args.rounds):
                order = list(arms) if r % 2 == 0 else list(arms)[::-1]
                for arm in order:
                    res = _attach(job.pid, args.seconds, f"{tmp}/{r}-{len(arm)}.json", arms[arm])
                    cpu[arm].append(res["cpu_s"])
                    print(
                        f"round {r + 1} {arm:12s} cpu {res['cpu_s']:.2f} s "
                        f"wall {res['wall_s']:.1f} s rss {res['gpudiag_maxrss_mb']:.0f} MB",
                        flush=True,
                    )
        finally:
            job.kill()
            job.wait()
            server.shutdown()
    ratios = [w / o for w, o in zip(cpu["with --otlp"], cpu["without"], strict=True)]
    print(f"OTLP posts received: {len(posts)} ({posts.count('/v1/logs')} of them logs)")
    print("CPU ratio with/without per round: " + ", ".join(f"{x:.3f}" for x in ratios))
    print(f"median ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
