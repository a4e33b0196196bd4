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


def test_recording_items_are_bounded_by_the_files_size(tmp_path, monkeypatch):
    """Issue 53 R6a: each line was bounded but not their number: 31 KB of gzip holding 10
    valid samples with 990,000 `{}` each replayed for 20 s. Past one line's worth, a file
    holds at most MAX_ITEMS_PER_BYTE items per byte: the rest is refused before parsing."""
    monkeypatch.setattr(recording, "MAX_LINE_ITEMS", 100_000)
    header = json.dumps({"format": "gpudiag-recording", "version": 1}).encode() + b"\n"
    sample = {"probe": "process", "t_ns": 1, "labels": {}, "values": {"cpu": 0.5}}
    junk = b',"junk":[' + b",".join([b"{}"] * 45_000) + b"]}\n"
    line = json.dumps(sample).encode()[:-1] + junk
    path = _gz(tmp_path / "many.jsonl.gz", [header] + [line] * 40)
    assert os.path.getsize(path) < 40_000
    parsed = []
    real = recording.parse_json
    monkeypatch.setattr(recording, "parse_json", lambda *a, **k: parsed.append(1) or real(*a, **k))
    with pytest.raises(UsageError, match="per byte: not a recording gpudiag wrote"):
        list(recording.iter_lines(path))
    per_line = line.count(b",") + line.count(b"{") + line.count(b"[")
    allowed = 100_000 + recording.MAX_ITEMS_PER_BYTE * os.path.getsize(path)
    assert (len(parsed) - 1) * per_line <= allowed < 40 * per_line / 2  # not the 40 lines


def test_what_gpudiag_writes_is_within_the_items_per_byte(tmp_path, monkeypatch):
    """The densest recording gpudiag writes (windows of a job whose values never change)
    reads back whole under the same bound, with almost no lines' worth free."""
    from gpudiag.probes.base import Sample

    monkeypatch.setattr(recording, "MAX_LINE_ITEMS", 5_000)
    path = str(tmp_path / "steady.jsonl.gz")
    rec = recording.Recorder(path, {}, layout="windows", width_ns=lambda: 1_000_000_000)
    t = 10**18
    for _ in range(20_000):
        t += 100_000_000
        rec.write(
            [
                Sample("gpu", t, {"gpu": "0"}, {"util": 0.0, "mem": 1.0, "power": 50.0}),
                Sample("process", t, {}, {"cpu": 0.0, "rss": 1e9}),
            ]
        )
    rec.close()
    lines = list(recording.iter_lines(path))
    assert len(lines) > 100
