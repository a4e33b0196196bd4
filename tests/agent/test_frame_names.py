"""A `;` in a function's name forges no stack frame (py-spy's collapsed format)."""

from __future__ import annotations


def _forged_stack(monkeypatch, frames: tuple[str, ...]) -> list[str]:
    """The findings of a run whose loop spends all its time in `frames`."""
    from gpudiag.analyzers import analyze
    from tests.analyzers import scenario
    from tests.analyzers.test_findings import ids, windows

    monkeypatch.setitem(scenario.STACKS, "forged", ";".join(frames))
    return ids(analyze(windows(scenario.Scenario(), shares={"forged": 1.0}).tl))


def test_a_semicolon_in_a_function_name_forges_no_frame(monkeypatch):
    """A job naming a function `train_step;save_checkpoint` (code.replace(co_name=...)) got a
    false CKPT001 at 100%: the stack label joins frames with ';'."""
    from gpudiag.probes.stacks.pyspy_output import parse_raw, parse_speedscope

    frames = [
        {"name": "<module>", "file": "/work/train.py", "line": 80},
        {"name": "train", "file": "/work/train.py", "line": 40},
        {"name": "train_step;save_checkpoint", "file": "/work/a;b.py", "line": 60},
    ]
    doc = {"shared": {"frames": frames}, "profiles": [{"name": "Thread 1", "samples": [[0, 1, 2]]}]}
    (row,), _ = parse_speedscope(doc, default_pid=1)
    assert len(row.frames) == 3 and ";" not in "".join(row.frames)
    assert "CKPT001" not in _forged_stack(monkeypatch, row.frames)
    # py-spy's raw (collapsed) lines: the piece before the ';' is not a frame of its own
    raw = "<module> (/work/train.py:80);train_step;save_checkpoint (/work/train.py:60) 5\n"
    (row,) = parse_raw([raw], default_pid=1)
    assert row.frames == (
        "<module> (/work/train.py:80)",
        "train_step；save_checkpoint (/work/train.py:60)",
    )
    assert "CKPT001" not in _forged_stack(monkeypatch, row.frames)
    # the check can fail: the frame as the old parser split it is a checkpoint save
    assert "CKPT001" in _forged_stack(
        monkeypatch, ("<module> (/w/t.py:1)", "save_checkpoint (/w/t.py:2)")
    )
