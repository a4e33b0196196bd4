"""The report's workload (training loop, batch inference or server) and, for a server or an
inference loop, its view of the work: requests, latency, forwards and their batch sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudiag.agent.output.report_types import Report

KINDS = {
    "training": "training loop",
    "inference": "batch-inference loop",
    "server": "server",
    "unknown": "not told apart",
}


def workload_lines(doc: Report) -> list[str]:
    """'Workload: server (unit: the request), from ...' and the request view; nothing for a
    report made before gpudiag told workloads apart."""
    w = doc.get("workload")
    if not w:
        return []
    out = [
        f"Workload: {KINDS.get(w['kind'], w['kind'])} (unit: the {w['unit']}), from {w['basis']}"
    ]
    return out + request_lines(doc.get("metrics") or {})


def _ms(v: float | None) -> str:
    return "?" if v is None else f"{v * 1e3:.1f} ms"


def request_lines(m: Mapping[str, Any]) -> list[str]:
    """The requests and forwards the hooks (or the stacks) measured, when there are any."""
    out = []
    if m.get("executions") is not None:
        out.extend(triton_lines(m))
    elif m.get("requests_per_second") is not None:
        out.append(
            f"  requests: {m['requests_per_second']:.1f}/s · latency p50 "
            f"{_ms(m.get('request_latency_p50_s'))}, p95 {_ms(m.get('request_latency_p95_s'))}"
            f", p99 {_ms(m.get('request_latency_p99_s'))} · in flight "
            f"{m.get('requests_in_flight_mean') or 0:.1f} on average"
            " (measured by the hooks)"
        )
    elif m.get("requests_in_flight_est") is not None:
        out.append(
            f"  requests in flight: {m['requests_in_flight_est']:.1f} on average, "
            f"{m.get('handler_forward_share') or 0:.0%} of handler time in the model "
            "(estimated from the stacks: request-handler samples per tick; the hooks give "
            "requests/s and latency)"
        )
        if m.get("connections_in_flight") is not None:
            busy = m.get("connections_busy_share") or 0.0
            serving = m["connections_in_flight"] / busy if busy else 0.0
            out.append(
                f"  connections: {m.get('connections_open') or 0:.1f} open, "
                f"{m['connections_in_flight']:.1f} requests received and not yet answered on "
                f"average, {serving:.1f} while any was ({busy:.0%} of the look; the kernel's "
                "socket table)"
            )
        if m.get("pool_forward_est") is not None and m.get("forwards_per_second") is None:
            out.append(
                f"  the model on {m.get('pool_threads') or 0:.0f} pool thread(s) apart from the "
                f"requests': {m['pool_forward_est']:.2f} forwards at once, "
                f"{m.get('pool_busy_est') or 0:.2f} calls in progress (estimated from the stacks)"
            )
    if m.get("forwards_per_second") is not None:
        out.append(
            f"  model forwards: {m['forwards_per_second']:.1f}/s"
            + (
                f" ({m['items_per_second']:.0f} items/s)"
                if m.get("items_per_second") is not None
                else ""
            )
            + f" · batch size p50 "
            f"{m.get('forward_batch_p50') or 0:.0f}, max {m.get('forward_batch_max') or 0:.0f}"
            f" · forward time p50 {_ms(m.get('forward_time_p50_s'))}"
            f" · autograd on in {m.get('forward_grad_share') or 0:.0%} of them"
        )
    if m.get("padding_share") is not None and m.get("forwards_per_second") is not None:
        out.append(
            f"  tokens: {m['padding_share']:.0%} padding · rows padded to "
            f"{m.get('padded_length_mean') or 0:.0f} tokens, each batch's longest row "
            f"{m.get('longest_length_mean') or 0:.0f}, real {m.get('real_length_mean') or 0:.0f}"
            " (the forwards' attention masks)"
        )
    return out


def triton_lines(m: Mapping[str, Any]) -> list[str]:
    """A Triton server's requests, as its own counters tell them."""
    p50 = m.get("request_latency_p50_s")
    latency = (
        f"latency p50 {_ms(p50)}, p95 {_ms(m.get('request_latency_p95_s'))}, p99 "
        f"{_ms(m.get('request_latency_p99_s'))} (mean {_ms(m.get('request_latency_mean_s'))})"
        if p50 is not None
        else f"latency mean {_ms(m.get('request_latency_mean_s'))} (p50/p95: tritonserver "
        "--metrics-config summary_latencies=true)"
    )
    rate = m.get("requests_per_second")
    return [
        f"  requests: {rate or 0:.1f}/s · {latency} · in flight "
        f"{m.get('requests_in_flight_mean') or 0:.1f} on average (Triton's counters)",
        f"  in Triton: {m.get('request_queue_share') or 0:.0%} of a request's time queued, "
        f"{m.get('request_compute_share') or 0:.0%} in the model · "
        f"{m.get('requests_per_execution') or 0:.1f} requests "
        f"({m.get('execution_batch_mean') or 0:.1f} items) an execution, "
        f"{_ms(m.get('execution_time_mean_s'))} each",
    ]
