"""gpudiag's own frames (its DataLoader wrapper `_install.<locals>.__next__`) stay out of
the stacks, locations and exports, and out of the job's printed tracebacks (issue 26,
item 5)."""

from __future__ import annotations

from gpudiag.probes.stacks.pyspy_output import parse_raw, parse_speedscope

USER = "train (/home/u/train.py:40)"

OWN = "__next__ (/opt/venv/lib/python3.11/site-packages/gpudiag/probes/inject/gpudiag_hooks.py:189)"

TORCH = "__next__ (/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py:733)"

GETITEM = "__getitem__ (/home/u/data.py:12)"


def test_raw_stacks_drop_gpudiag_frames():
    line = f'process 7:"python train.py";thread (0x1): MainThread;{USER};{OWN};{TORCH};{GETITEM} 5'
    (row,) = parse_raw([line], 7)
    assert row.frames == (USER, TORCH, GETITEM)
    assert not any("gpudiag_hooks" in f for f in row.frames)


def test_speedscope_stacks_drop_gpudiag_frames():
    def frame(text: str) -> dict:
        name, loc = text.split(" (")
        file, line = loc.rstrip(")").rsplit(":", 1)
        return {"name": name, "file": file, "line": int(line)}

    doc = {
        "shared": {"frames": [frame(f) for f in (USER, OWN, TORCH)]},
        "profiles": [{"name": 'Thread 1 "MainThread"', "samples": [[0, 1, 2]], "weights": [1]}],
    }
    rows, _ = parse_speedscope(doc, 7)
    assert [r.frames for r in rows] == [(USER, TORCH)]
