"""A bounded load generator for serve_http.py: N client threads on 127.0.0.1 sending requests
back to back for --seconds; prints the client-side requests/s and latency p50/p95/p99.
--grpc: the same requests as unary RPCs to serve_grpc.py (/gpudiag.Model/Predict, JSON
bodies), one channel a client, opened (and connected) before its first timed request.

    python load_gen.py --port-file /tmp/port --clients 4 --seconds 10 [--grpc]
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


ROWS = False  # --rows: the tokens as one row of a batch (BentoML's batchable input)


def body(rng: random.Random) -> str:
    """One request's JSON: 24 random token ids and the same as text (for --tokenize)."""
    tokens = [rng.randrange(1000) for _ in range(24)]
    if ROWS:
        return json.dumps({"tokens": [tokens]})
    text = " ".join(f"W{t}." for t in tokens)
    return json.dumps({"tokens": tokens, "text": text})


def cpu_wait_s() -> float:
    """This thread's time so far waiting for a CPU (runnable, not running: schedstat's
    second field); 0.0 where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


# per request, the client's own wait for a CPU inside its timed span (a busy box delays the
# client's reading of an answer the server already sent): its latency less it is printed too
OWN_WAIT: list[float] = []


def client(
    port: int, until: float, seed: int, out: list[float], errors: list[str], ends: list[float]
) -> None:
    rng = random.Random(seed)
    while time.perf_counter() < until:
        req = body(rng)
        w0 = cpu_wait_s()
        t0 = time.perf_counter()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/predict", req, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            if resp.status >= 400:  # an error answered is no answer (a server's 500, 503)
                raise OSError(f"HTTP {resp.status}")
        except OSError as exc:
            errors.append(str(exc))
            time.sleep(0.05)
            continue
        ends.append(time.perf_counter())
        out.append(ends[-1] - t0)
        OWN_WAIT.append(cpu_wait_s() - w0)


def grpc_client(
    port: int, until: float, seed: int, out: list[float], errors: list[str], ends: list[float]
) -> None:
    """serve_grpc.py's client: unary RPCs on one channel, connected before the first."""
    import grpc  # here: a forked client process starts gRPC itself (not inherited)

    rng = random.Random(seed)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        predict = channel.unary_unary(
            "/gpudiag.Model/Predict",
            request_serializer=str.encode,
            response_deserializer=json.loads,
        )
        try:
            grpc.channel_ready_future(channel).result(timeout=30)
        except grpc.FutureTimeoutError:
            errors.append("channel not ready in 30 s")
            return
        while time.perf_counter() < until:
            req = body(rng)
            t0 = time.perf_counter()
            try:
                predict(req, timeout=30)
            except grpc.RpcError as exc:
                errors.append(str(exc))
                time.sleep(0.05)
                continue
            ends.append(time.perf_counter())
            out.append(ends[-1] - t0)


def _one_process(port: int, until: float, seed: int, results, run=client) -> None:
    lat: list[float] = []
    errors: list[str] = []
    ends: list[float] = []
    run(port, until, seed, lat, errors, ends)
    results.put((lat, errors, ends, OWN_WAIT[:]))


def _in_processes(
    n: int, port: int, until: float, run=client
) -> tuple[list[float], list[str], list[float]]:
    """One client a process, as separate machines' clients are: no client waits for another's
    GIL (perf_counter is the system's monotonic clock, the same in every process)."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_one_process, args=(port, until, i, results, run)) for i in range(n)
    ]
    for p in procs:
        p.start()
    lat: list[float] = []
    errors: list[str] = []
    ends: list[float] = []
    for _ in procs:
        a, b, c, d = results.get(timeout=until - time.perf_counter() + 60)
        lat += a
        errors += b
        ends += c
        OWN_WAIT.extend(d)
    for p in procs:
        p.join()
    return lat, errors, ends


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
    p.add_argument("--grpc", action="store_true", help="unary RPCs to serve_grpc.py")
    p.add_argument("--rows", action="store_true", help="tokens as one row (serve_bentoml.py)")
    args = p.parse_args()
    global ROWS
    ROWS = args.rows
    run = grpc_client if args.grpc else client
    port = args.port or wait_port(args.port_file)
    time.sleep(args.delay)
    lat: list[float] = []
    errors: list[str] = []
    ends: list[float] = []
    t0 = time.perf_counter()
    until = t0 + args.seconds
    if args.procs:
        lat, errors, ends = _in_processes(args.clients, port, until, run)
    else:
        threads = [
            threading.Thread(target=run, args=(port, until, i, lat, errors, ends))
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
    if len(OWN_WAIT) == len(lat) and any(OWN_WAIT):
        less = [t - w for t, w in zip(lat, OWN_WAIT, strict=True)]
        print(
            f"client: p50 less its own wait for a CPU {quantile(less, 0.5) * 1e3:.1f} ms "
            f"(that wait's p50 {quantile(OWN_WAIT, 0.5) * 1e3:.1f} ms)",
            flush=True,
        )


if __name__ == "__main__":
    main()
