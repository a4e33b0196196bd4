"""The Triton probe: Triton's metrics text parsed (a real 2.51 scrape), its endpoint read
from the server's command line, and a real HTTP server named `tritonserver` on 127.0.0.1
(tests/workloads/fake_tritonserver.py) found among the job's processes and scraped into
per-model intervals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.servers.triton import TritonProbe, find_server, metrics_url, parse_metrics

FIXTURE = Path(__file__).parent.parent / "fixtures" / "triton" / "metrics_2.51_summaries.txt"


def test_a_real_scrape_parses_into_one_models_counters() -> None:
    rows = parse_metrics(FIXTURE.read_text())
    assert list(rows) == [("classifier", "1")]
    r = rows[("classifier", "1")]
    assert r["requests"] == 3655 and r["inferences"] == 3655 and r["executions"] == 3655
    assert r["failures"] == 0  # four reasons, summed
    assert r["request_s"] == pytest.approx(58.137007)
    assert r["queue_s"] == pytest.approx(43.263996)
    assert r["compute_infer_s"] == pytest.approx(14.390557)
    assert 0 <= r["pending"] < 10
    assert 0.005 < r["latency_p50_s"] < r["latency_p95_s"] < r["latency_p99_s"] < 0.1


def test_the_metrics_endpoint_comes_from_the_command_line() -> None:
    assert metrics_url(["tritonserver"]) == "http://127.0.0.1:8002/metrics"
    assert metrics_url(["x", "--metrics-port=9100"]) == "http://127.0.0.1:9100/metrics"
    got = metrics_url(["x", "--metrics-address", "10.0.0.5", "--metrics-port", "9"])
    assert got == "http://10.0.0.5:9/metrics"
    assert metrics_url(["x", "--metrics-address=0.0.0.0"]) == "http://127.0.0.1:8002/metrics"
    assert metrics_url(["x", "--allow-metrics", "false"]) is None
    assert metrics_url(["x", "--allow-metrics=0"]) is None


def test_a_job_without_triton_leaves_no_trace() -> None:
    probe = TritonProbe()
    assert probe.open(Target(os.getpid())).available
    assert probe.sample() == [] and not probe.applies()
    assert probe.final_status() is None and find_server(os.getpid()) is None


def test_counters_that_go_back_start_counting_again() -> None:
    probe = TritonProbe()
    key = ("m", "1")
    base = {"requests": 100.0, "request_s": 2.0}
    assert probe._interval(key, 0, base) == []
    assert probe._interval(key, 500_000_000, {"requests": 150.0, "request_s": 3.0}) == []
    got = probe._interval(key, 1_000_000_000, {"requests": 10.0, "request_s": 0.2})
    assert got and got[0].values["requests"] == 50  # the interval before the restart
    # after the restart: a new baseline, no negative interval
    got = probe._interval(key, 1_500_000_000, {"requests": 60.0, "request_s": 1.2})
    assert all((s.values.get("requests") or 0) >= 0 for s in got)
