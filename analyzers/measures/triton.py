"""A Triton server's requests, from its own counters (probes/servers/triton.py): the served
model's request rate, latency, requests in flight, the shares of a request queued and in the
model, and the batch each execution ran."""

from __future__ import annotations

from gpudiag.analyzers.timeline.timeline import Aggregate

PROBE = "triton"
MIN_STEADY_S = 1.0  # intervals inside the traffic needed to rate it from them alone

TRITON_UNITS = {
    "request_latency_mean_s": "s",
    "requests_pending_max": "count",
    "request_queue_share": "ratio",
    "request_compute_share": "ratio",
    "execution_batch_mean": "items",
    "requests_per_execution": "requests",
    "execution_time_mean_s": "s",
    "executions": "count",
}


def runs_triton(tl: Aggregate) -> bool:
    """Whether the Triton probe read a server's counters at all (traffic or none)."""
    return any(p == PROBE for p, _n, _l in tl.series)


def served_model(tl: Aggregate) -> dict[str, str] | None:
    """The labels (model, version) of the model that served the most requests; None: none
    served any."""
    best, most = None, 0.0
    for labels, r in tl.matching(PROBE, "requests"):
        if r.total > most:
            best, most = labels, r.total
    return best


def _total(tl: Aggregate, name: str, labels: dict[str, str]) -> float:
    r = tl.rollup(PROBE, name, **labels)
    return r.total if r is not None and r.count else 0.0


def _last(tl: Aggregate, name: str, labels: dict[str, str]) -> float | None:
    r = tl.rollup(PROBE, name, **labels)
    return r.last if r is not None and r.count else None


def _rate(tl: Aggregate, labels: dict[str, str], requests: float) -> float | None:
    """Requests/s over the scrape intervals inside the traffic (its first and last, partly
    idle, left out), else over every interval that served any."""
    steady_s = _total(tl, "steady_s", labels)
    if steady_s >= MIN_STEADY_S:
        return _total(tl, "steady_requests", labels) / steady_s
    busy_s = _total(tl, "busy_s", labels)
    return requests / busy_s if busy_s > 0 else None


def triton_metrics(tl: Aggregate) -> dict[str, float | None]:
    """The serving metrics of the model a Triton server served most ({} for none)."""
    labels = served_model(tl)
    if labels is None:
        return {}
    requests = _total(tl, "requests", labels)
    spent = _total(tl, "request_s", labels)
    executions = _total(tl, "executions", labels)
    rate = _rate(tl, labels, requests)
    mean = spent / requests if requests else None
    pending = tl.rollup(PROBE, "pending", **labels)
    compute = sum(
        _total(tl, n, labels) for n in ("compute_input_s", "compute_infer_s", "compute_output_s")
    )
    return {
        "requests": requests,
        "requests_per_second": rate,
        "request_latency_mean_s": mean,
        "request_latency_p50_s": _last(tl, "latency_p50_s", labels),
        "request_latency_p95_s": _last(tl, "latency_p95_s", labels),
        "request_latency_p99_s": _last(tl, "latency_p99_s", labels),
        # Little's law: requests in flight = arrival rate x time in the server
        "requests_in_flight_mean": rate * mean if rate and mean else None,
        "requests_pending_max": pending.maximum if pending and pending.count else None,
        "request_queue_share": _total(tl, "queue_s", labels) / spent if spent else None,
        "request_compute_share": compute / spent if spent else None,
        "executions": executions,
        "execution_batch_mean": _total(tl, "inferences", labels) / executions
        if executions
        else None,
        "requests_per_execution": requests / executions if executions else None,
        "execution_time_mean_s": _total(tl, "compute_infer_s", labels) / executions
        if executions
        else None,
    }


def latency_basis(tl: Aggregate) -> str:
    """Where a Triton server's latency figures come from."""
    labels = served_model(tl)
    if labels is not None and _last(tl, "latency_p50_s", labels) is not None:
        return "Triton's own latency summary (its recent window)"
    return (
        "Triton's counters: the mean only (tritonserver --metrics-config "
        "summary_latencies=true gives p50/p95/p99)"
    )
