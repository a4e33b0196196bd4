"""benchmarks/try_bench.py: the table says whether the hand-made change lies in the interval,
and the hand-made edits change the workloads' code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[2]
spec = importlib.util.spec_from_file_location("try_bench", ROOT / "benchmarks" / "try_bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _row(hand: float) -> dict:
    return {
        "workload": "starved_loader",
        "diagnosed": ["DATA001"],
        "finding": "DATA001",
        "fix": {"kind": "dataloader", "values": {"num_workers": 1}},
        "predicted": 1.5,
        "measured": 1.4,
        "interval": [1.2, 1.6],
        "rounds": 3,
        "verdict": "held",
        "hand": hand,
    }


def test_table_marks_the_hand_made_change_inside_or_outside():
    assert "| x1.50 | yes |" in bench.table([_row(1.5)])
    assert "| x2.00 | no |" in bench.table([_row(2.0)])


def test_hand_made_edits_apply_to_the_planted_workloads():
    for name, kind, values in (
        ("starved_loader", "dataloader", {"num_workers": 1}),
        ("sync_checkpoint", "checkpoint", {"every": 4}),
    ):
        src = (ROOT / "tests" / "workloads" / f"{name}.py").read_text()
        assert bench.EDITS[kind](src, values) != src
    demo = (ROOT / "agent" / "commands" / "demo_job.py").read_text()  # `gpudiag demo`'s job too
    assert "num_workers=1" in bench.EDITS["dataloader"](demo, {"num_workers": 1})


def test_step_rates_from_every_kind_of_job_output():
    assert bench.rate_of("x\nsteps: 120 in 10.0 s\n", 99) == 12.0  # workloads, public scripts
    assert bench.rate_of("demo job: 50 steps\n", 10) == 5.0  # the demo's job
    assert bench.rate_of("no count here", 10) is None


def test_public_scripts_take_the_flags_that_make_a_fix_by_hand():
    for name, (path, flags) in bench.PUBLIC_FLAGS.items():
        src = (ROOT / "tests" / "public" / path).read_text()
        for kind, make in flags.items():
            values = {"num_workers": 2} if kind == "dataloader" else {"every": 2}
            flag = make(values)[0]
            assert f'"{flag}"' in src, (name, flag)
