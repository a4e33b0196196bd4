"""The windows recording: the live timeline's segments on disk, replayed to the same analysis.

Each H100 recording (every sample, as recorded on the GPU box) is fed through a live-like
timeline with a windows recorder beside it, as `gpudiag run --record` does; replaying the
windows file must give what analysing the samples in one piece gives.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.output.recording import Recorder, open_recording, read_recording
from gpudiag.analyzers import analyze
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import Sample

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "h100"
FOOTER = {"probes": [], "errors": [], "end_reason": "stopped"}


def record_windows(samples: list[Sample], path: Path, batch: int = 50, **kw) -> Timeline:
    """Feed samples in batches to a live timeline and a windows recorder (as a session
    does); the live timeline."""
    live = Timeline(**kw)
    rec = Recorder(str(path), {"run": {"pid": 1}}, width_ns=lambda: live.segment_ns)
    for i in range(0, len(samples), batch):
        chunk = samples[i : i + batch]
        live.extend(chunk)
        rec.write(chunk)
    rec.close(FOOTER)
    return live


def same_timeline(a: Timeline, b: Timeline) -> None:
    assert a.segment_ns == b.segment_ns and a.origin_ns == b.origin_ns
    assert [(s, e) for s, e, _ in a.spans()] == [(s, e) for s, e, _ in b.spans()]
    for (_, _, x), (_, _, y) in zip(a.spans(), b.spans(), strict=True):
        assert x.series.keys() == y.series.keys()
        for key, r in x.series.items():
            o = y.series[key]
            assert (r.count, r.minimum, r.maximum, r.last) == (
                o.count,
                o.minimum,
                o.maximum,
                o.last,
            )
            assert r.total == pytest.approx(o.total, rel=1e-9, abs=1e-9)
            assert r.buckets == o.buckets
        assert x.stacks.keys() == y.stacks.keys()
        for tkey, table in x.stacks.items():
            assert table == pytest.approx(y.stacks[tkey])
        assert x.episodes == y.episodes and x.worker_pids == y.worker_pids


@pytest.mark.parametrize("name", ["starved", "launch", "ckpt", "healthy"])
def test_windows_replay_of_the_h100_recordings_gives_the_same_findings(name, tmp_path):
    _, samples = read_recording(str(FIXTURES / f"{name}.jsonl.gz"))
    path = tmp_path / f"{name}.windows.jsonl.gz"
    live = record_windows(samples, path)
    replayed = open_recording(str(path)).timeline()
    same_timeline(live, replayed)
    a, b = analyze(live), analyze(replayed)
    assert [(f.id, f.severity) for f in a.findings] == [(f.id, f.severity) for f in b.findings]
    for f, g in zip(a.findings, b.findings, strict=True):
        assert g.impact == pytest.approx(f.impact, rel=1e-6)
        assert g.expected_speedup == pytest.approx(f.expected_speedup, rel=1e-6)
    assert b.breakdown.shares == pytest.approx(a.breakdown.shares, abs=1e-9)


def _tick(i: int) -> list[Sample]:
    """One second of a small job: a host row, a GPU row and a py-spy window every 3 s."""
    t = 1_000_000_000 * i
    out = [
        Sample("host", t, {"cpu": str(i % 4)}, {"core_util": (i * 7919 % 1000) / 1000}),
        Sample("gpu", t, {"gpu": "0"}, {"util_gpu": float(i % 100)}),
        Sample("hooks", t, {"kind": "step"}, {"step_time_s": 0.01 + (i % 7) / 1000}),
    ]
    if i % 3 == 0:
        out += [
            Sample("stacks", t, {"kind": "window", "mode": "all"}, {"ticks": 300.0}),
            Sample(
                "stacks",
                t,
                {
                    "kind": "stack",
                    "mode": "all",
                    "tid": "7",
                    "thread": "MainThread",
                    "stack": f"main (train.py:{10 + i % 5});step (train.py:3)",
                    "code": "",
                },
                {"count": 300.0},
            ),
        ]
    return out


def test_a_long_run_coarsens_the_same_way_and_late_samples_are_merged(tmp_path):
    samples = [s for i in range(3000) for s in _tick(i)]
    samples.append(Sample("host", 5_000_000_000, {"cpu": "0"}, {"core_util": 0.25}))  # late
    path = tmp_path / "long.jsonl.gz"
    live = record_windows(samples, path, batch=7, max_segments=64)
    replayed = open_recording(str(path)).timeline(Timeline(max_segments=64))
    assert live.segment_ns == 64_000_000_000  # 3000 s in at most 64 segments
    same_timeline(live, replayed)
    assert replayed.whole().rollup("hooks", "step_time_s", kind="step").count == 3000


def test_a_windows_recording_cut_short_replays_what_was_written(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    rec = Recorder(str(path), {"run": {"pid": 1}})
    for i in range(120):
        rec.write(_tick(i))
    rec._f.flush()  # the agent was killed: no footer, no gzip trailer
    opened = open_recording(str(path))
    tl = opened.timeline()
    assert opened.footer is None
    steps = tl.whole().rollup("hooks", "step_time_s", kind="step").count
    assert 60 <= steps < 120  # what had been written: all but the last segments


def test_rotation_redefines_the_keys_in_each_file(tmp_path, cli):
    path = tmp_path / "rot.jsonl.gz"
    rec = Recorder(str(path), {"run": {"pid": 1}}, max_bytes=60_000)
    for i in range(3000):
        cores = [
            Sample("host", 1_000_000_000 * i, {"cpu": str(c)}, {"core_util": (i * c % 97) / 97})
            for c in range(32)
        ]
        rec.write(_tick(i) + cores)
    rec.close(FOOTER)
    assert rec.rotations >= 1
    res = cli("replay", str(path), "--format", "json")
    assert res.returncode == 0, res.stderr
    tl = open_recording(str(path)).timeline()
    assert tl.whole().rollup("gpu", "util_gpu", gpu="0").count > 0


def test_a_broken_window_line_is_refused_in_one_line(tmp_path, cli):
    path = tmp_path / "bad.jsonl.gz"
    with gzip.open(path, "wt") as f:
        head = {"format": "gpudiag-recording", "version": 2, "layout": "windows"}
        f.write(json.dumps(head) + "\n")
        f.write(json.dumps({"segment": [0, 0, 1_000_000_000], "series": [[5, 1]]}) + "\n")
    with pytest.raises(UsageError, match="line 2 is not a timeline window"):
        open_recording(str(path)).timeline()
    res = cli("replay", str(path))
    assert res.returncode == 2 and "line 2 is not a timeline window" in res.stderr
    assert "Traceback" not in res.stderr


def test_the_key_table_stays_bounded_when_stacks_keep_changing():
    from gpudiag.analyzers.timeline.codec import Decoder, Encoder

    enc, dec = Encoder(max_table=50), Decoder()
    for i in range(40):
        tl = Timeline()
        tl.extend(_tick(3 * i))
        tl.add(Sample("gpu", 3 * i, {"gpu": f"x{i}"}, {"util_gpu": 1.0}))  # a new key each time
        row = json.loads(json.dumps(enc.encode(tl.whole())))
        agg = dec.decode(row)
        assert agg.rollup("gpu", "util_gpu", gpu=f"x{i}").count == 1
        assert len(enc._ids) <= 60 and len(dec._table) <= 60
