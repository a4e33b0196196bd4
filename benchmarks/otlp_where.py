"""Where `--otlp`'s CPU goes: `gpudiag attach PID --duration S --otlp URL` run in this process
on benchmarks/light_job.py, with the OTLP path's parts timed in the thread CPU of whichever
thread runs them (time.thread_time): the SDK's import, the collector read (`snapshot`: the
job's live analysis and gpudiag's own cost), the exports (encoding and sending), the verdict
record and the close; then the process's whole CPU (its threads, the receiver's included: it
runs here too, and the py-spy it waited for).

    python benchmarks/otlp_where.py --seconds 60 [--protocol grpc]
    OTEL_METRIC_EXPORT_INTERVAL=10000 python benchmarks/otlp_where.py   # the old 10 s
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from otlp_cost import grpc_receiver, receiver  # noqa: E402

SPENT: dict[str, list[float]] = defaultdict(list)


def timed(owner: Any, attr: str, label: str) -> None:
    """Wrap owner.attr so that each call's thread CPU is added to SPENT[label]."""
    inner: Callable = getattr(owner, attr)

    def wrapper(*args: Any, **kw: Any) -> Any:
        t = time.thread_time()
        try:
            return inner(*args, **kw)
        finally:
            SPENT[label].append(time.thread_time() - t)

    setattr(owner, attr, wrapper)


def patch(protocol: str) -> None:
    """Time the OTLP path's parts (the SDK is imported here: its import is timed alone)."""
    t = time.process_time()
    from opentelemetry.sdk._logs import LoggerProvider  # noqa: F401
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: F401

    from gpudiag.agent.fleet import metrics, otlp

    otlp.exporters("http://127.0.0.1:1", protocol)  # the exporter modules' import
    SPENT["import (SDK and exporter)"].append(time.process_time() - t)
    timed(otlp.OtlpExport, "__init__", "set-up (resource, instruments)")
    timed(otlp.OtlpExport, "snapshot", "collector read (live analysis + own cost)")
    timed(metrics.LiveJob, "doc", "  of which the live analysis")
    timed(otlp.OtlpExport, "verdict", "verdict record")
    timed(otlp.OtlpExport, "close", "close (last export, logs)")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc import exporter as g

        timed(g.OTLPExporterMixin, "_export", "export (encode + send)")
    else:
        from opentelemetry.exporter.otlp.proto.http import metric_exporter as m

        timed(m.OTLPMetricExporter, "export", "export (encode + send)")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--protocol", choices=("http", "grpc"), default="http")
    args = ap.parse_args()
    from agent_cost import _start_job

    from gpudiag.agent.cli.main import main as gpudiag

    if args.protocol == "grpc":
        posts, url, stop = grpc_receiver()
        proto = "grpc"
    else:
        posts, url, stop = receiver()
        proto = "http/protobuf"
    job = _start_job(0, args.seconds + 60, 0)
    try:
        time.sleep(8)  # past start-up: the job is training
        patch(proto)
        before = resource.getrusage(resource.RUSAGE_SELF)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            flags = ["--otlp", url, "--otlp-protocol", proto]
            argv = ["attach", str(job.pid), "-q", "--duration", str(args.seconds), *flags]
            rc = gpudiag([*argv, "--out", f"{tmp}/r.json"])
            wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        job.kill()
        job.wait()
        stop()
    own = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(
        f"attach rc {rc}, {wall:.1f} s wall; this process {own:.2f} s CPU (threads), "
        f"children waited for {kids.ru_utime + kids.ru_stime:.2f} s; posts {len(posts)}"
    )
    for label, xs in SPENT.items():
        each = ", ".join(f"{1000 * x:.0f}" for x in xs) if "analysis" in label else ""
        print(f"{label:44s} {sum(xs):7.3f} s in {len(xs)} calls" + (f" (ms: {each})" * bool(each)))


if __name__ == "__main__":
    main()
