"""gpudiag's own frames (its DataLoader wrapper `_install.<locals>.__next__`) stay out of
the stacks, locations and exports, and out of the job's printed tracebacks (issue 26,
item 5)."""

from __future__ import annotations

from pathlib import Path

import gpudiag.probes.inject
from gpudiag.analyzers.measures.rules import parse_frame, user_location
from gpudiag.probes.stacks.pyspy_output import INJECTED_FILES, parse_raw, parse_speedscope

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


# the compute sampler's op-counting mode runs under every op of a counted step, the loaders'
# too (num_workers=0): a busy CI run named it as the loader's hot function (load 7)
COUNTING = (
    "make_mode.<locals>.Counting.__torch_dispatch__ (/tmp/ci/probes/inject/gpudiag_compute.py:179)"
)
OP = "__call__ (/opt/venv/lib/python3.11/site-packages/torch/_ops.py:829)"


def test_the_compute_samplers_dispatch_frame_is_dropped():
    line = f'process 7:"python t.py";thread (0x1): MainThread;{USER};{GETITEM};{OP};{COUNTING} 3'
    (row,) = parse_raw([line], 7)
    assert row.frames == (USER, GETITEM, OP)


def test_every_injected_module_is_gpudiags_own_code():
    """A frame in any module gpudiag injects is never the job's code, dropped or not."""
    inject = Path(gpudiag.probes.inject.__file__).parent
    names = {p.name for p in inject.glob("gpudiag_*.py")}
    assert names and set(INJECTED_FILES) == names
    for name in names:
        fr = parse_frame(f"f (/srv/x/probes/inject/{name}:3)")
        assert fr.is_own and not fr.is_user, name
    assert user_location(f"{USER};{GETITEM};{COUNTING}") == parse_frame(GETITEM)
