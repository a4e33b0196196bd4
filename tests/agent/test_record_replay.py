"""--record writes the run; `gpudiag replay` gives the live run's findings back."""

from __future__ import annotations

import gzip
import json

import pytest

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.output.recording import Recorder, open_recording, read_recording
from gpudiag.probes.base import Sample


def test_recording_round_trip_and_cut_short(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    r = Recorder(str(path), {"environment": {"host": "h"}, "run": {"pid": 1}}, layout="samples")
    samples = [Sample("host", i, {}, {"cpu_util": 0.5}) for i in range(10)]
    r.write(samples)
    r.close({"probes": [], "errors": [], "end_reason": "stopped"})
    rec, got = read_recording(str(path))
    assert got == samples and rec.footer["end_reason"] == "stopped"
    # a recording whose writer died (no footer, no gzip trailer) still replays
    cut = tmp_path / "cut.jsonl.gz"
    w = Recorder(str(cut), {"run": {"pid": 1}}, layout="samples")
    w.write(samples)
    w._f.flush()  # what reached the disk before the agent was killed
    rec, got = read_recording(str(cut))
    assert rec.footer is None and got == samples


def test_replay_rejects_what_is_not_a_recording(tmp_path, cli):
    bad = tmp_path / "x.jsonl.gz"
    bad.write_text("hello")
    res = cli("replay", str(bad))
    assert res.returncode == 2 and "not a gpudiag recording" in res.stderr
    other = tmp_path / "y.jsonl.gz"
    with gzip.open(other, "wt") as f:
        f.write('{"format": "something-else"}\n')
    res = cli("replay", str(other))
    assert res.returncode == 2 and "no header" in res.stderr


def _noisy(i: int) -> Sample:
    return Sample(
        "host",
        1_000_000_000 * i,
        {"cpu": str(i % 8)},
        {"core_util": (i * 7919 % 1000) / 1000.0, "x": float(i * 104729 % 99991)},
    )


def test_recording_is_bounded_by_rotation_and_replays_the_newest_part(tmp_path, cli):
    path = tmp_path / "long.jsonl.gz"
    r = Recorder(str(path), {"run": {"pid": 1}}, max_bytes=40_000, layout="samples")
    for i in range(0, 20_000, 100):
        r.write([_noisy(j) for j in range(i, i + 100)])
    r.close({"probes": [], "errors": [], "end_reason": "stopped"})
    older = tmp_path / "long.jsonl.gz.1"
    assert r.rotations >= 2 and older.exists()
    assert path.stat().st_size + older.stat().st_size <= 40_000 + 20_000  # one batch of slack
    rec, got = read_recording(str(path))
    assert rec.previous == str(older) and rec.footer["rotations"] == r.rotations
    assert got[-1] == _noisy(19_999)  # the newest samples are all there, in order
    assert got[0].t_ns > 0  # the oldest were dropped
    assert [s.t_ns for s in got] == sorted(s.t_ns for s in got)
    res = cli("replay", str(path), "--format", "json")
    assert res.returncode == 0, res.stderr


def test_replay_streams_the_file(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"format": "gpudiag-recording", "version": 1}) + "\n")
        for i in range(3):
            f.write(json.dumps(_noisy(i).to_dict()) + "\n")
        f.write('{"probe": "host"}\n')  # a broken line after three good ones
    rec = open_recording(str(path))  # reads the header only
    stream = rec.samples()
    assert [next(stream) for _ in range(3)] == [_noisy(i) for i in range(3)]
    with pytest.raises(UsageError, match="line 5 is not a sample"):
        next(stream)
