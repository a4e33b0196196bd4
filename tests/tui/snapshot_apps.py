"""Apps for the snapshot tests: the diagnosis view over fixed reports (no clock)."""

from __future__ import annotations

import sys

from gpudiag.agent.output.report import RunInfo, build_report
from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.tui.app import DiagnosisApp
from gpudiag.tui.feeds import static_feed
from tests.analyzers.scenario import Scenario
from tests.analyzers.test_gpu_findings import HEALTHY, STARVED, timeline
from tests.probes.fake_nvml import FakeGpu, const

ME = 4242
START = 1_795_000_000.0


def doc_of(tl) -> dict:
    return build_report(
        analysis=analyze(tl),
        run_info=RunInfo("replay", ["python", "train.py"], ME, START, START + 15, "replayed"),
        environment={"host": "h", "cpu_count": 16, "python": "3.11"},
        probes=[],
        errors=[],
        thresholds=Thresholds(),
    )


def scenario(name: str) -> dict:
    import os

    me = os.getpid()
    if name == "starved":
        return doc_of(timeline(FakeGpu(job_pids=[me], util=const(25)), shares=STARVED).tl)
    if name == "healthy":
        return doc_of(timeline(FakeGpu(job_pids=[me])).tl)
    if name == "throttled":
        return doc_of(
            timeline(
                FakeGpu(job_pids=[me], throttle={"hw_thermal": const(0.4)}, sm_clock=const(1400))
            ).tl
        )
    if name == "two_gpus":
        return doc_of(
            timeline(
                FakeGpu(job_pids=[me], util=const(95)),
                FakeGpu(uuid="GPU-1", job_pids=[me], util=const(45)),
            ).tl
        )
    if name == "hooked":  # step timing from the hooks and a location deep in torch
        doc = doc_of(timeline(FakeGpu(job_pids=[me], util=const(25)), shares=STARVED).tl)
        doc["metrics"].update(
            steps_per_second=17.34,
            samples_per_second=1109.8,
            step_time_p50_s=0.0571,
            step_time_p95_s=0.0702,
            workers=4.0,
            worker_cpu_cores=3.62,
        )
        doc["findings"][0]["location"] = (
            "/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py:733:"
            "_BaseDataLoaderIter.__next__"
        )
        return doc
    sc = Scenario(cpu_count=16)  # no GPU
    for _ in range(5):
        sc.window(STARVED if name == "no_gpu" else HEALTHY)
    sc.host(0.2).process(0.9)
    return doc_of(sc.tl)


def app(name: str) -> DiagnosisApp:
    return DiagnosisApp(static_feed(scenario(name), f"replay {name}.jsonl.gz"), clock=False)


if __name__ == "__main__":
    app(sys.argv[1] if len(sys.argv) > 1 else "starved").run()
