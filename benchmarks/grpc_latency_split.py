"""Where a gRPC request's time goes that the request hooks cannot see: serve_grpc.py's model
behind grpcio's sync server with gpudiag's gRPC patch, N client processes sending unary RPCs
back to back. Each request carries its client's send time; CLOCK_MONOTONIC (perf_counter) is
the same in every process, so the client's send, the hooks' start (the call's event on the
poller thread), the behavior's start and end, and the client holding the answer line up.

    python benchmarks/grpc_latency_split.py --clients 4 --seconds 5

Prints the client's and the hooks' p50, and the p50 of each leg: send to the hooks' start,
the hooks' start to the behavior (the pool's queue), the behavior, its end to the client.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

WORKLOADS = Path(__file__).resolve().parent.parent / "tests" / "workloads"
METHOD = "/gpudiag.Model/Predict"


def _dumps(obj) -> bytes:
    return json.dumps(obj).encode()


def server(port_q, seconds: float, rows_q) -> None:
    """The model server, patched by gpudiag's hooks; each RPC's arrival (the hooks' start)
    kept by its state for the behavior to read."""
    sys.path.insert(0, str(WORKLOADS))
    import grpc
    import torch
    from grpc import _server
    from serve_http import SEQ, TinyTransformer

    from gpudiag.probes.inject import gpudiag_serve

    rec = gpudiag_serve.Recorder(lambda: None)
    gpudiag_serve._patch_grpc_server(_server, rec)
    hooked, arrivals = _server._handle_call, {}

    def handle_call(*args, **kwargs):
        t = getattr(gpudiag_serve._GRPC_EVENT, "t", None)
        got = hooked(*args, **kwargs)
        if got[0] is not None:
            arrivals[id(got[0])] = t
        return got

    _server._handle_call = handle_call
    torch.set_num_threads(1)
    model = TinyTransformer().eval()
    legs: list[tuple] = []

    def predict(req, context):
        start = time.perf_counter()
        x = torch.tensor([(req["tokens"] + [0] * SEQ)[:SEQ]])
        label = model(x).argmax(dim=1).tolist()[0]
        end = time.perf_counter()
        legs.append((req["sent"], arrivals.pop(id(context._state), None), start, end))
        return {"label": label, "end": end}

    handler = grpc.unary_unary_rpc_method_handler(
        predict, request_deserializer=json.loads, response_serializer=_dumps
    )
    lags: list[float] = []

    def sentinel() -> None:  # a thread waking from C every 2 ms: how long it waits for the GIL
        while True:
            t = time.perf_counter()
            time.sleep(0.002)
            lags.append(time.perf_counter() - t - 0.002)

    if os.environ.get("SENTINEL"):
        threading.Thread(target=sentinel, daemon=True).start()
    srv = grpc.server(futures.ThreadPoolExecutor(8))
    srv.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("gpudiag.Model", {"Predict": handler}),)
    )
    port_q.put(srv.add_insecure_port("127.0.0.1:0"))
    srv.start()
    time.sleep(seconds)
    srv.stop(1).wait()
    time.sleep(0.2)
    rows_q.put((legs, rec.take()[1], lags))


def client(port: int, until: float, q) -> None:
    import grpc

    rng, got = random.Random(os.getpid()), []
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        call = channel.unary_unary(
            METHOD, request_serializer=_dumps, response_deserializer=json.loads
        )
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            call({"tokens": [rng.randrange(1000) for _ in range(24)], "sent": t0}, timeout=30)
            got.append((t0, time.perf_counter()))
    q.put(got)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    ctx = multiprocessing.get_context("spawn")
    port_q, rows_q, client_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
    srv = ctx.Process(target=server, args=(port_q, args.seconds + 3, rows_q))
    srv.start()
    port = port_q.get(timeout=60)
    time.sleep(0.5)
    until = time.perf_counter() + args.seconds
    clients = [
        ctx.Process(target=client, args=(port, until, client_q)) for _ in range(args.clients)
    ]
    for c in clients:
        c.start()
    sent: list[tuple[float, float]] = []
    for _ in clients:
        sent += client_q.get(timeout=args.seconds + 60)
    legs, requests, lags = rows_q.get(timeout=60)
    srv.join()
    by_send = {round(s, 9): (a, b, e) for s, a, b, e in legs if a is not None}
    split: dict[str, list[float]] = {"to hooks": [], "queued": [], "behavior": [], "back": []}
    total = []
    for t0, t1 in sent:
        a, b, e = by_send[round(t0, 9)]
        split["to hooks"].append(a - t0)
        split["queued"].append(b - a)
        split["behavior"].append(e - b)
        split["back"].append(t1 - e)
        total.append(t1 - t0)

    def p50(xs: list[float]) -> float:
        return statistics.median(xs) * 1e3

    print(
        f"{args.clients} client processes, load {os.getloadavg()[0]:.2f}: client p50 "
        f"{p50(total):.2f} ms, hooks' p50 {p50([r[1] for r in requests]):.2f} ms "
        f"({len(total)} RPCs, {len(requests)} timed)"
    )
    print(
        f"  p50: send to the hooks' start {p50(split['to hooks']):.2f} ms, to the behavior "
        f"{p50(split['queued']):.2f}, the behavior {p50(split['behavior']):.2f}, its end to "
        f"the client {p50(split['back']):.2f}"
    )
    if lags:
        print(
            f"  a thread waking from C waits (SENTINEL=1): p50 {p50(lags):.2f} ms, mean "
            f"{statistics.mean(lags) * 1e3:.2f} ms over {len(lags)} wakes"
        )


if __name__ == "__main__":
    main()
