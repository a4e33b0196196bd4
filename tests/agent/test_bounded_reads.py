"""The files gpudiag reads go through one bounded reader: never from a device or a fifo, never
another user's dump or segment, a recording's lines bounded before they are parsed."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.output import recording
from gpudiag.probes.dist.flight_recorder import read_dumps
from gpudiag.probes.stacks.pyspy_output import SourceLines
from tests.agent.test_write_targets import FIXTURE, NOBODY, finishes, root_only


def test_stack_source_lines_are_never_read_from_a_device_or_fifo(tmp_path):
    """A frame naming /dev/zero made root's attach read forever; a FIFO blinded the probe."""
    fifo = tmp_path / "src.py"
    os.mkfifo(fifo)
    src = SourceLines()
    assert finishes(lambda: src.line(os.getpid(), "f (/dev/zero:1)")) == ""
    assert finishes(lambda: src.line(os.getpid(), f"f ({fifo}:1)")) == ""
    ok = tmp_path / "ok.py"
    ok.write_text("import torch\nx = 1\n")
    assert src.line(os.getpid(), f"f ({ok}:2)") == "x = 1"


def test_flight_recorder_never_waits_on_a_fifo(tmp_path):
    """A FIFO at the default /tmp/nccl_trace_rank_0 hung every distributed run's report."""
    prefix = str(tmp_path / "nccl_trace_rank_")
    os.mkfifo(prefix + "0")
    assert finishes(lambda: read_dumps(prefix, [0])) == {}


@root_only
def test_flight_recorder_dumps_of_another_user_are_ignored(tmp_path):
    """Two small planted dumps gave a healthy DDP job a false DIST002."""
    from tests.probes.test_flight_recorder import entry, write_dumps

    prefix = write_dumps(tmp_path, {0: [entry(3, "started")]}, as_json=True)
    assert read_dumps(prefix, [0]) != {}  # our own dump is read
    os.chown(prefix + "0", NOBODY, NOBODY)
    assert read_dumps(prefix, [0]) == {}
    assert read_dumps(prefix, [0], owners={NOBODY}) != {}  # the ranks' own user's is read


def _gz(path: Path, lines: list[bytes]) -> str:
    with gzip.open(path, "wb") as f:
        f.write(b"".join(lines))
    return str(path)


def test_recording_empty_line_flood_is_refused_in_bounded_time(tmp_path):
    """200 MB of empty lines in a 204 KB file replayed for 257 s."""
    header = json.dumps({"format": "gpudiag-recording", "version": 2}).encode() + b"\n"
    path = _gz(tmp_path / "r.jsonl.gz", [header, b"\n" * (recording.MAX_BLANK_LINES + 10)])
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="empty lines"):
        list(recording.iter_lines(path))
    assert time.monotonic() - t0 < 5


def test_recording_line_items_are_bounded_before_parsing(tmp_path, monkeypatch):
    """One 60 MiB `[{},{},...]` line took 3.1 GB: items are counted before json parses."""
    monkeypatch.setattr(recording, "MAX_LINE_ITEMS", 1000)
    line = b'{"x":[' + b",".join([b"{}"] * 2000) + b"]}\n"
    path = _gz(tmp_path / "r.jsonl.gz", [line])
    parsed = []
    monkeypatch.setattr(recording, "parse_json", lambda *a, **k: parsed.append(1))
    with pytest.raises(UsageError, match="more than 1000 items"):
        list(recording.iter_lines(path))
    assert parsed == []


@root_only
def test_an_older_segment_of_another_user_is_not_merged(tmp_path):
    """A planted FILE.1 with the right header was merged into another user's replay."""
    import shutil

    rec = tmp_path / "r.jsonl.gz"
    shutil.copy(FIXTURE, rec)
    header = next(recording.iter_lines(str(rec)))
    header.update(segment=1, recording_id="abc")
    older = dict(header, segment=0)
    _gz(rec, [json.dumps(header).encode() + b"\n"])
    _gz(Path(str(rec) + ".1"), [json.dumps(older).encode() + b"\n"])
    assert recording.open_recording(str(rec)).previous == str(rec) + ".1"
    os.chown(str(rec) + ".1", NOBODY, NOBODY)
    assert recording.open_recording(str(rec)).previous is None
