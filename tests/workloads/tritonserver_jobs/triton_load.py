"""Clients posting Triton's KServe v2 JSON inference requests back to back (one item each,
32 tokens padded: the model's fixed input), printing the rate and latency percentiles as
load_gen.py does.

    python triton_load.py --port 8000 --clients 4 --seconds 15
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import threading
import time

SEQ = 32


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="classifier")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0)
    a = p.parse_args()
    lat: list[float] = []
    errors = [0]
    end = time.time() + a.seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=30)
        while time.time() < end:
            n = random.randint(16, SEQ)
            tokens = [random.randint(1, 999) for _ in range(n)] + [0] * (SEQ - n)
            body = json.dumps(
                {
                    "inputs": [
                        {"name": "tokens", "shape": [1, SEQ], "datatype": "INT64", "data": tokens}
                    ]
                }
            )
            t = time.perf_counter()
            conn.request(
                "POST", f"/v2/models/{a.model}/infer", body, {"Content-Type": "application/json"}
            )
            r = conn.getresponse()
            r.read()
            errors[0] += r.status != 200
            lat.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client) for _ in range(a.clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - t0
    lat.sort()

    def q(f: float) -> float:
        return lat[min(len(lat) - 1, int(f * len(lat)))] * 1e3

    print(
        f"client: {len(lat)} requests in {took:.1f} s: {len(lat) / took:.1f} req/s, "
        f"p50 {q(0.5):.1f} ms, p95 {q(0.95):.1f} ms, p99 {q(0.99):.1f} ms, {errors[0]} errors"
    )


if __name__ == "__main__":
    main()
