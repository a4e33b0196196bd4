"""A stand-in for `tritonserver` in tests: a real HTTP server on 127.0.0.1 whose /metrics
answers in Triton 2.51's format (tests/fixtures/triton/metrics_2.51_summaries.txt), its
counters growing as a model served `--rate` requests/s in executions of `--batch`, each
request `--latency-ms` in the server, `--queue-share` of it queued. Run as an executable
named `tritonserver` (the probe finds the server by its process name):

    tritonserver --metrics-port 8002 --rate 200 --batch 1
"""

from __future__ import annotations

import argparse
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTER = '# TYPE {name} counter\n{name}{{model="{model}",version="1"}} {value}\n'


def render(a: argparse.Namespace, elapsed: float) -> str:
    """The metrics text after `elapsed` seconds of traffic."""
    n = int(a.rate * max(0.0, elapsed - a.idle_first))
    us = a.latency_ms * 1e3
    values = {
        "nv_inference_request_success": n,
        "nv_inference_count": n,
        "nv_inference_exec_count": n // a.batch,
        "nv_inference_request_duration_us": int(n * us),
        "nv_inference_queue_duration_us": int(n * us * a.queue_share),
        "nv_inference_compute_input_duration_us": int(n * 10),
        "nv_inference_compute_infer_duration_us": int(n * us * (1 - a.queue_share) * 0.9),
        "nv_inference_compute_output_duration_us": int(n * 30),
    }
    text = "".join(COUNTER.format(name=k, model=a.model, value=v) for k, v in values.items())
    text += (
        "# TYPE nv_inference_request_failure counter\n"
        f'nv_inference_request_failure{{model="{a.model}",reason="OTHER",version="1"}} 0\n'
        "# TYPE nv_inference_pending_request_count gauge\n"
        f'nv_inference_pending_request_count{{model="{a.model}",version="1"}} {a.pending}\n'
        "# TYPE nv_cpu_utilization gauge\nnv_cpu_utilization 0.5\n"
    )
    if a.summaries:
        text += "# TYPE nv_inference_request_summary_us summary\n" + "".join(
            f'nv_inference_request_summary_us{{model="{a.model}",version="1",quantile="{q}"}} '
            f"{us * f:.0f}\n"
            for q, f in (("0.5", 1.0), ("0.95", 1.4), ("0.99", 1.8))
        )
    if a.new_models:  # a hostile server: new model names on every scrape
        a.scrapes = getattr(a, "scrapes", 0) + 1
        text += "# TYPE nv_inference_request_success counter\n" + "".join(
            f'nv_inference_request_success{{model="m{a.scrapes}_{i}",version="1"}} 1\n'
            for i in range(a.new_models)
        )
    return text


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--allow-metrics", default="true")
    p.add_argument("--model", default="classifier")
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--queue-share", type=float, default=0.75)
    p.add_argument("--pending", type=int, default=3)
    p.add_argument("--idle-first", type=float, default=0.0, help="seconds with no traffic first")
    p.add_argument("--summaries", action="store_true")
    p.add_argument("--new-models", type=int, default=0, help="new model names per scrape")
    a = p.parse_args()
    t0 = time.monotonic()

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render(a, time.monotonic() - t0).encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", a.metrics_port), Metrics).serve_forever()


if __name__ == "__main__":
    main()
