"""Summary metrics of a run (host, process, sampling), derived from the timeline."""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

from gpudiag.analyzers.timeline.timeline import Aggregate

# Stack samples 10 ms apart are strongly correlated (a slow call spans many); for confidence
# we count one sample in this many as independent.
SAMPLE_CORRELATION = 10

METRIC_UNITS = {
    "duration_s": "s",
    "cpu_count": "cores",
    "cpu_physical": "cores",
    "host_cpu_util": "ratio",
    "host_free_cores": "cores",
    "host_iowait": "ratio",
    "psi_io_some": "ratio",
    "psi_cpu_some": "ratio",
    "psi_memory_some": "ratio",
    "target_cpu_cores": "cores",
    "target_rss_bytes": "bytes",
    "workers": "count",
    "worker_cpu_cores": "cores",
    "worker_rss_bytes": "bytes",
    "worker_d_state_share": "ratio",
    "read_bytes_per_s": "bytes/s",
    "swap_in_bytes_per_s": "bytes/s",
    "stack_samples": "samples",
    "startup_samples": "samples",
    "stack_windows": "count",
    "stack_errors": "count",
    "stack_rate_achieved": "ratio",
    "loop_thread_cpu": "ratio",
    "loop_thread_d_state": "ratio",
    "gpus": "count",
}


def metric_unit(name: str) -> str:
    """The unit of a metric, including the per-GPU ones (gpuN_busy, gpuN_vram_peak_bytes)."""
    from gpudiag.analyzers.measures.serving import SERVING_UNITS
    from gpudiag.analyzers.measures.throughput import THROUGHPUT_UNITS

    if name in METRIC_UNITS:
        return METRIC_UNITS[name]
    if name in THROUGHPUT_UNITS:
        return THROUGHPUT_UNITS[name]
    if name in SERVING_UNITS:
        return SERVING_UNITS[name]
    if name.endswith("_busy"):
        return "ratio"
    return "bytes" if name.endswith("_bytes") else ""


def host_metrics(tl: Aggregate) -> dict[str, float | None]:
    """Means over the run of the host and process series the findings rest on."""
    cpu_count = tl.maximum("host", "cpu_count")
    util = tl.mean("host", "cpu_util")
    free = cpu_count * (1.0 - util) if cpu_count is not None and util is not None else None
    read_t = tl.mean("process", "read_bytes_per_s", scope="target") or 0.0
    read_w = tl.mean("process", "read_bytes_per_s", scope="workers") or 0.0
    w = tl.windows.get("all")
    return {
        "duration_s": tl.duration_s,
        "cpu_count": cpu_count,
        "cpu_physical": tl.maximum("host", "cpu_physical"),
        "host_cpu_util": util,
        "host_free_cores": free,
        "host_iowait": tl.mean("host", "cpu_iowait"),
        "psi_io_some": tl.mean("host", "psi_io_some"),
        "psi_cpu_some": tl.mean("host", "psi_cpu_some"),
        "psi_memory_some": tl.mean("host", "psi_memory_some"),
        "target_cpu_cores": tl.mean("process", "cpu_cores", scope="target"),
        "target_rss_bytes": tl.maximum("process", "rss_bytes", scope="target"),
        "workers": tl.maximum("process", "procs", scope="workers"),
        "worker_cpu_cores": tl.mean("process", "cpu_cores", scope="workers"),
        "worker_rss_bytes": tl.maximum("process", "rss_bytes", scope="workers"),
        "worker_d_state_share": tl.mean("process", "d_state_share", scope="workers"),
        "target_runqueue_cores": tl.mean("process", "runqueue_cores", scope="target"),
        "worker_runqueue_cores": tl.mean("process", "runqueue_cores", scope="workers"),
        "others_cpu_cores": tl.mean("host", "other_cpu_cores", scope="others"),
        "read_bytes_per_s": read_t + read_w
        if tl.rollup("process", "read_bytes_per_s", scope="target")
        else None,
        "swap_in_bytes_per_s": tl.mean("host", "swap_in_bytes_per_s"),
        "stack_windows": float(w.windows) if w else 0.0,
        "stack_errors": float(w.errors) if w else 0.0,
        "stack_rate_achieved": rate_achieved(w),
    }


def rate_achieved(w: Any) -> float | None:
    """The share of the ticks py-spy was asked for that it recorded (its `--idle` loop
    samples every thread each tick): under 1 when the box starved the sampler of CPU."""
    if w is None or w.expected_ticks <= 0:
        return None
    return round(min(1.0, w.ticks / w.expected_ticks), 4)


def share_interval(share: float, samples: float, z: float = 1.2816) -> tuple[float, float]:
    """The interval of a sampled share (Wilson score, with correlated samples counted once in
    SAMPLE_CORRELATION): at the default z, 90% sure the true share is above the low end, and
    90% sure it is below the high end. Sound at shares of 0 and 1, where the normal
    approximation of `confidence_above` is not."""
    n = max(1.0, samples / SAMPLE_CORRELATION)
    p = min(max(share, 0.0), 1.0)
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, mid - half), min(1.0, mid + half)


def straddles(share: float, threshold: float, samples: float) -> bool:
    """True when the samples cannot yet tell the share from its threshold either way."""
    low, high = share_interval(share, samples)
    return low < threshold <= high


def confidence_above(share: float, threshold: float, samples: float) -> float:
    """Probability that a sampled share's true value exceeds the threshold (normal approx.)."""
    n = max(1.0, samples / SAMPLE_CORRELATION)
    p = min(max(share, 1e-6), 1 - 1e-6)
    se = (p * (1 - p) / n) ** 0.5
    return NormalDist().cdf((share - threshold) / se)
