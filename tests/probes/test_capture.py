"""The bounded profiler capture: N steps of a CPU training job through the in-process hooks,
summarised in the job, checked against the job's own step timings; the profiler is off after."""

from __future__ import annotations

import pytest

from gpudiag.probes.inject.gpudiag_capture import summarise


def test_summary_of_a_cuda_trace_sorts_copies_syncs_and_tensor_cores():
    """A scripted CUDA trace (the profiler's Chrome export): pageable and pinned copies with
    bytes, a sync with the GPU gap after it, fp32 vs tensor-core GEMMs."""

    def x(cat, name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}

    trace = {
        "traceEvents": [
            x("user_annotation", "gpudiag_step#0", 0, 1000),
            x("user_annotation", "gpudiag_step#1", 1000, 1000),
            x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 10, 200, 7, bytes=4 << 20),
            x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 1010, 50, 7, bytes=4 << 20),
            x("kernel", "ampere_sgemm_128x64_nn", 300, 300, 7),
            x("kernel", "sm80_xmma_gemm_bf16bf16_bf16f32", 1100, 100, 7),
            x("cuda_runtime", "cudaStreamSynchronize", 600, 100),
            x("user_annotation", "enumerate(DataLoader)#_Iter.__next__", 1000, 10),
            x("cuda_runtime", "cudaLaunchKernel", 1090, 10),
        ]
    }
    cap = summarise(trace, [0.0, 0.001, 0.002])
    assert cap["device"] == "cuda"
    kinds = {(c["kind"], c["direction"]): c for c in cap["copies"]}
    assert kinds[("pageable", "HtoD")]["bytes"] == 4 << 20
    assert kinds[("pinned", "HtoD")]["count"] == 1
    assert cap["tensor_core_share"] == pytest.approx(100 / 400)
    sync = cap["syncs"][0]
    assert sync["name"] == "cudaStreamSynchronize" and sync["gpu_gap_after_s"] == pytest.approx(
        (1010 - 700) / 1e6
    )
    assert cap["steps"][0]["busy_s"] == pytest.approx(500 / 1e6)
    assert cap["steps"][1]["busy_s"] == pytest.approx(150 / 1e6)
    idle = cap["idle_by_host_s"]
    assert idle["sync"] == pytest.approx(100 / 1e6)  # 600-700 while the GPU idled
    assert idle["data"] == pytest.approx(10 / 1e6) and idle["launch"] == pytest.approx(10 / 1e6)
    assert sum(idle.values()) == pytest.approx((500 + 850) / 1e6)
    assert idle["profiler"] == 0.0  # the marks and the marked ranges agree here


def test_a_failing_capture_never_breaks_the_job(capsys):
    """An error inside the profiler (here: export fails) switches it off and is one line."""
    torch = pytest.importorskip("torch")
    from gpudiag.probes.inject.gpudiag_capture import Capture

    cap = Capture(torch, None, steps=2, after=1)
    m = torch.nn.Linear(4, 1)
    for _ in range(5):
        m(torch.randn(2, 4)).sum().backward()
        if cap.prof is not None:
            cap.prof.export_chrome_trace = lambda path: (_ for _ in ()).throw(OSError("disk full"))
        cap.on_step()
    assert cap.done and cap.summary is None and cap.prof is None
    assert not torch.autograd._profiler_enabled()
    assert "profiler capture given up: disk full" in capsys.readouterr().err


def test_spans_merge_nested_and_overlapping_intervals():
    from gpudiag.probes.inject.gpudiag_capture import _Spans

    sp = _Spans([(5, 8), (0, 10), (12, 15), (14, 20), (30, 31)])
    assert sp.covered(0, 40) == 10 + 8 + 1
    assert sp.covered(9, 13) == 1 + 1
    assert sp.gaps(0, 40) == [(10, 12), (20, 30), (31, 40)]
    assert sp.gaps(-5, 3) == [(-5, 0)]
    assert _Spans([]).gaps(1, 2) == [(1, 2)] and _Spans([]).covered(1, 2) == 0
