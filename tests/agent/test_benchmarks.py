"""The benchmarks run and give what they promise (slow: run with -m slow)."""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_stability_summary_counts_truth_self_agreement_and_not_sure():
    import importlib.util

    spec = importlib.util.spec_from_file_location("stability", BENCH / "stability.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    looks = [
        {"top": "CKPT001", "sure": True, "samples": 300, "agent_cpu_cores": 0.02},
        {"top": "CKPT001", "sure": True, "samples": 200, "agent_cpu_cores": 0.03},
        {"top": "HOST001", "sure": True, "samples": 250, "agent_cpu_cores": 0.02},
        {"top": None, "sure": False, "samples": 90, "agent_cpu_cores": 0.02},
        {"error": "gpudiag: cannot attach"},
    ]
    s = mod.summarize("sync_checkpoint", looks)
    assert (s["n"], s["errors"], s["right"], s["not_sure"], s["wrong_sure"]) == (5, 1, 2, 1, 1)
    assert (s["modal"], s["modal_n"], s["samples_min"], s["samples_median"]) == (
        "CKPT001",
        2,
        90,
        225.0,
    )
    loader = mod.summarize("starved_loader", [{"top": "DATA002", "sure": True, "samples": 1}])
    assert loader["right"] == 0 and loader["wrong_sure"] == 1  # one cause, one id: DATA001
    healthy = mod.summarize("healthy", [{"top": None, "sure": True, "samples": 400}])
    assert healthy["right"] == 1 and healthy["wrong_sure"] == 0
    assert "| sync_checkpoint | CKPT001 | run | idle | 2/5 |" in mod.table(
        [{"workload": "sync_checkpoint", "mode": "run", "load": "idle", "summary": s}]
    )


def test_step_stalls_summary_splits_long_steps_and_the_box_beside_them():
    import importlib.util

    spec = importlib.util.spec_from_file_location("step_stalls", BENCH / "step_stalls.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    times = [0.0, 0.5, 1.0, 9.0, 9.5]  # steps of 0.5, 0.5, 8.0, 0.5 s
    # [time, box cores, job cores, gpudiag cores] every 0.5 s: others take a core in the stall
    rows = [[t / 2, 2.0, 1.9, 0.05] for t in range(1, 3)]
    rows += [[t / 2, 2.0, 0.9, 0.1] for t in range(3, 19)]
    rows += [[9.5, 2.0, 1.9, 0.05]]
    s = mod.summary("run", times, rows, 1.0, 2.0)
    assert (s["steps"], s["stalls"], s["stall_s"], s["median_step_s"]) == (4, 1, 8.0, 0.5)
    assert s["others_cores_in_stalls"] == 1.0 and s["others_cores_in_fast"] < 0.1
    assert s["gpudiag_cores_in_stalls"] == 0.1 and s["load"] == [1.0, 2.0]
