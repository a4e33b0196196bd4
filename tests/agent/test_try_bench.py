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
