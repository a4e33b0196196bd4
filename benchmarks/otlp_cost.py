"""What `--otlp` adds to gpudiag's own cost: `gpudiag attach --duration S` on
benchmarks/light_job.py in three arms: without `--otlp`, with `--otlp` over OTLP/HTTP to a
receiver this script runs on 127.0.0.1 (it accepts and counts the posts), and with
`--otlp-protocol grpc` to a gRPC receiver it runs on 127.0.0.1 (OpenTelemetry's Metrics and
Logs services from opentelemetry-proto's stubs, as tests/e2e/agent/test_otlp.py serves them).
The arms are interleaved, their order rotated and reversed from round to round; gpudiag's
whole CPU (wait4's rusage: its threads and every py-spy) and peak RSS per attach, each arm's
median and spread, the ratio to the same round's `without` and its median. "Unchanged" is
said when an arm's median ratio lies within the `without` arm's own run-to-run spread in this
run ((max - min) / median of its rounds).

    python benchmarks/otlp_cost.py --seconds 60 --rounds 2
    python benchmarks/otlp_cost.py --seconds 60 --rounds 2 --no-grpc --every-10s   # before/after
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_cost import _attach, _start_job  # noqa: E402  # the same attach and job

INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
Receiver = tuple[list[str], str, Callable[[], None]]  # what it got, its URL, its stop


def receiver() -> Receiver:
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

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return posts, f"http://127.0.0.1:{server.server_address[1]}", stop


def grpc_receiver() -> Receiver:
    """An OTLP/gRPC endpoint on 127.0.0.1 (opentelemetry-proto's service stubs on a real
    grpc.server) that answers every export and records which service got it."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as lpb
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as lgrpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc

    posts: list[str] = []

    class Metrics(mgrpc.MetricsServiceServicer):
        def Export(self, request, context):  # noqa: N802  # the service's name
            posts.append("/v1/metrics")
            return mpb.ExportMetricsServiceResponse()

    class Logs(lgrpc.LogsServiceServicer):
        def Export(self, request, context):  # noqa: N802
            posts.append("/v1/logs")
            return lpb.ExportLogsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    mgrpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    lgrpc.add_LogsServiceServicer_to_server(Logs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return posts, f"http://127.0.0.1:{port}", lambda: server.stop(grace=None).wait(5)


def spread(xs: list[float]) -> float:
    """(max - min) / median: the run-to-run spread of one arm's rounds."""
    return (max(xs) - min(xs)) / statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--no-grpc", action="store_true", help="leave the gRPC arm out")
    ap.add_argument(
        "--every-10s",
        action="store_true",
        help="add an OTLP/HTTP arm exporting every 10 s (OTEL_METRIC_EXPORT_INTERVAL=10000, "
        "gpudiag's interval before it took the SDK's 60 s)",
    )
    args = ap.parse_args()
    posts, url, stop = receiver()
    arms = {"without": [], "http": ["--otlp", url, "--otlp-protocol", "http/protobuf"]}
    stops = [stop]
    gposts: list[str] = []
    if not args.no_grpc:
        gposts, gurl, gstop = grpc_receiver()
        arms["grpc"] = ["--otlp", gurl, "--otlp-protocol", "grpc"]
        stops.append(gstop)
    if args.every_10s:
        arms["http-10s"] = arms["http"]
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[:3]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        job = _start_job(args.workers, (args.seconds + 15) * len(arms) * args.rounds + 60, 0)
        try:
            time.sleep(8)  # past start-up: the job is training
            for r in range(args.rounds):
                order = list(arms)[r % len(arms) :] + list(arms)[: r % len(arms)]
                for arm in order if r % 2 == 0 else order[::-1]:
                    os.environ.pop(INTERVAL, None)
                    if arm == "http-10s":
                        os.environ[INTERVAL] = "10000"
                    res = _attach(job.pid, args.seconds, f"{tmp}/{r}-{arm}.json", arms[arm])
                    os.environ.pop(INTERVAL, None)
                    cpu[arm].append(res["cpu_s"])
                    print(
                        f"round {r + 1} {arm:8s} cpu {res['cpu_s']:.2f} s "
                        f"wall {res['wall_s']:.1f} s rss {res['gpudiag_maxrss_mb']:.0f} MB",
                        flush=True,
                    )
        finally:
            job.kill()
            job.wait()
            for s in stops:
                s()
    with open("/proc/loadavg") as f:
        print(f"load average at end: {f.read().split()[:3]}")
    print(f"OTLP/HTTP posts received: {len(posts)} ({posts.count('/v1/logs')} of them logs)")
    if not args.no_grpc:
        print(f"OTLP/gRPC exports received: {len(gposts)} ({gposts.count('/v1/logs')} logs)")
    noise = spread(cpu["without"])
    base = statistics.median(cpu["without"])
    print(
        f"without: cpu {', '.join(f'{x:.2f}' for x in cpu['without'])} s, median {base:.2f}, "
        f"spread {100 * noise:.1f}%"
    )
    for arm in list(arms)[1:]:
        ratios = [w / o for w, o in zip(cpu[arm], cpu["without"], strict=True)]
        med = statistics.median(ratios)
        verdict = "unchanged" if abs(med - 1) <= noise else "above the spread"
        print(
            f"{arm}: cpu {', '.join(f'{x:.2f}' for x in cpu[arm])} s, median "
            f"{statistics.median(cpu[arm]):.2f}, spread {100 * spread(cpu[arm]):.1f}%; ratio "
            f"per round {', '.join(f'{x:.3f}' for x in ratios)}, median {med:.3f}: {verdict} "
            f"(within +-{100 * noise:.1f}%)"
        )


if __name__ == "__main__":
    main()
