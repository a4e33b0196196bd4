"""A bounded load generator for serve_http.py: N client threads on 127.0.0.1 sending requests
back to back for --seconds; prints the client-side requests/s and latency p50/p95/p99.

    python load_gen.py --port-file /tmp/port --clients 4 --seconds 10
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import statistics
import threading
import time


def wait_port(path: str, timeout: float = 60.0) -> int:
    """The port the server wrote to `path`, once it has."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if os.path.exists(path):
            return int(open(path).read())
        time.sleep(0.05)
    raise SystemExit(f"no port in {path} after {timeout:.0f} s")


def client(
    port: int, until: float, seed: int, out: list[float], errors: list[str], ends: list[float]
) -> None:
    rng = random.Random(seed)
    while time.perf_counter() < until:
        tokens = [rng.randrange(1000) for _ in range(24)]
        text = " ".join(f"W{t}." for t in tokens)
        body = json.dumps({"tokens": tokens, "text": text})
        t0 = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
            conn.getresponse().read()
            conn.close()
        except OSError as exc:
            errors.append(str(exc))
            time.sleep(0.05)
            continue
        ends.append(time.perf_counter())
        out.append(ends[-1] - t0)


def _one_process(port: int, until: float, seed: int, results) -> None:
    lat: list[float] = []
    errors: list[str] = []
    ends: list[float] = []
    client(port, until, seed, lat, errors, ends)
    results.put((lat, errors, ends))


def _in_processes(
    n: int, port: int, until: float, lat: list[float], errors: list[str], ends: list[float]
) -> None:
    """One client a process, as separate machines' clients are: no client waits for another's
    GIL (perf_counter is the system's monotonic clock, the same in every process)."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_one_process, args=(port, until, i, results)) for i in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        a, b, c = results.get(timeout=until - time.perf_counter() + 60)
        lat += a
        errors += b
        ends += c
    for p in procs:
        p.join()


def quantile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q * 100) - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int)
    p.add_argument("--port-file")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--delay", type=float, default=0.0, help="seconds before the load starts")
    p.add_argument("--procs", action="store_true", help="one process per client, not a thread")
    args = p.parse_args()
    port = args.port or wait_port(args.port_file)
    time.sleep(args.delay)
    lat: list[float] = []
    errors: list[str] = []
    ends: list[float] = []
    t0 = time.perf_counter()
    until = t0 + args.seconds
    if args.procs:
        _in_processes(args.clients, port, until, lat, errors, ends)
    else:
        threads = [
            threading.Thread(target=client, args=(port, until, i, lat, errors, ends))
            for i in range(args.clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    span = time.perf_counter() - t0
    if not lat:
        raise SystemExit(f"no request answered ({len(errors)} errors)")
    # the rate between the first answer and the last (threads starting on a busy box left
    # out), as the server's side counts it
    answered = max(ends) - min(ends)
    rate = (len(ends) - 1) / answered if answered > 0 else len(lat) / span
    print(
        f"client: {len(lat)} requests in {span:.1f} s: {rate:.1f} req/s, "
        f"p50 {quantile(lat, 0.5) * 1e3:.1f} ms, p95 {quantile(lat, 0.95) * 1e3:.1f} ms, "
        f"p99 {quantile(lat, 0.99) * 1e3:.1f} ms, {len(errors)} errors",
        flush=True,
    )


if __name__ == "__main__":
    main()
