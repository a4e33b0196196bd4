"""The capture's summary read back from the timeline, and what it says about findings."""

from __future__ import annotations

import json

from gpudiag.analyzers.engine.catalogue_doc import catalogue
from gpudiag.analyzers.measures.capture import capture_checks, capture_of
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import Sample

catalogue()  # the finding units' specs, which capture_checks reads (the engine loads them)


def cuda_capture(idle: float = 0.6, pageable: int = 512 << 20, tc: float = 0.02) -> dict:
    return {
        "device": "cuda",
        "steps": [
            {"start_s": i * 0.1, "dur_s": 0.1, "busy_s": 0.1 * (1 - idle), "idle_s": 0.1 * idle}
            for i in range(4)
        ],
        "copies": [{"kind": "pageable", "direction": "HtoD", "bytes": pageable, "count": 4}],
        "syncs": [
            {"name": "cudaStreamSynchronize", "count": 8, "time_s": 0.01, "gpu_gap_after_s": 0.02}
        ],
        "tensor_core_share": tc,
    }


def finding(fid: str) -> dict:
    return {"id": fid, "evidence": []}


def test_capture_confirms_pageable_copies_idle_and_fp32():
    checks, ev = capture_checks(
        [finding("XFER001"), finding("GPU003"), finding("MEM001")],
        cuda_capture(),
        0.7,
        Thresholds(),
    )
    by = {c["finding"]: c for c in checks}
    assert (
        by["XFER001"]["confirms"] and "512 MiB copied from pageable" in by["XFER001"]["statement"]
    )
    assert by["GPU003"]["confirms"] and "2% of matrix-kernel time" in by["GPU003"]["statement"]
    assert "MEM001" not in by  # the capture says nothing about VRAM headroom
    metrics = {e["metric"] for e in ev["XFER001"]}
    assert {"capture_gpu_idle_share", "capture_pageable_h2d_bytes"} <= metrics
    assert all(e["source"] == "capture" for e in ev["XFER001"])


def test_capture_refutes_when_the_gpu_was_busy_and_on_tensor_cores():
    checks, _ = capture_checks(
        [finding("DATA001"), finding("GPU003")], cuda_capture(idle=0.05, tc=0.95), 0.7, Thresholds()
    )
    assert not any(c["confirms"] for c in checks)
    assert "does not confirm DATA001" in checks[0]["statement"]


def test_a_cpu_capture_tests_no_gpu_finding():
    cap = cuda_capture() | {"device": "cpu"}
    assert capture_checks([finding("DATA001")], cap, 0.7, Thresholds()) == ([], {})


def test_capture_of_reads_the_latest_summary_and_places_it_in_the_run():
    tl = Timeline()
    tl.add(Sample("host", 1_000_000_000, {}, {"cpu_util": 0.5}))
    summary = {
        "device": "cpu",
        "steps": [{"start_s": 0.0, "dur_s": 0.01, "busy_s": 0.005, "idle_s": 0.005}],
        "top_ops": [{"name": "aten::mm", "time_s": 0.004, "calls": 2}, {"bad": 1}],
        "events": [{"name": "x", "ts": 0.0, "dur": 0.001, "lane": "ops"}, {"ts": "no"}],
    }
    tl.add(
        Sample(
            "hooks",
            3_500_000_000,
            {"kind": "capture", "summary": json.dumps(summary)},
            {"capture_steps": 1.0},
        )
    )
    cap = capture_of(tl)
    assert cap["start_s_run"] == 2.5 and len(cap["steps"]) == 1
    assert cap["top_ops"] == [{"name": "aten::mm", "time_s": 0.004, "calls": 2}]
    assert len(cap["events"]) == 1


def test_an_unreadable_summary_is_ignored():
    tl = Timeline()
    tl.add(Sample("hooks", 1, {"kind": "capture", "summary": "{not json"}, {"capture_steps": 1.0}))
    assert capture_of(tl) is None
    assert capture_of(Timeline()) is None
