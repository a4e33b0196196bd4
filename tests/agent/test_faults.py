"""Faults gpudiag must survive: a probe that hangs, py-spy missing, denied or crashing, NVML
failing mid-run, a full disk or a vanished output folder. Each leaves a report (or, where
the report itself cannot be written, one clear error and the summary)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from gpudiag.agent.cli import main as cli
from gpudiag.agent.output.recording import Recorder
from gpudiag.probes.base import Sample

FIXTURE = Path(__file__).parents[1] / "fixtures" / "h100" / "ckpt.jsonl.gz"


def test_a_full_disk_stops_the_recording_not_the_run(tmp_path):
    rec = Recorder("/dev/full", {"run": {"command": ["x"]}})
    for i in range(3000):
        rec.write([Sample("host", i, {}, {"x": float(i), "y": float(i * 7919 % 104729)})])
    rec.close({"probes": []})
    assert rec.failed == os.strerror(errno.ENOSPC)


def test_a_full_disk_for_the_report_is_one_error_after_the_summary(monkeypatch, tmp_path, capsys):
    from gpudiag.agent.base import safeio

    real_write = os.write

    def full(fd, data):
        real_write(fd, bytes(data[:20]))  # half a report...
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safeio.os, "write", full)
    out = tmp_path / "r.json"
    assert cli.main(["replay", str(FIXTURE), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert "Verdict:" in captured.out or "CKPT001" in captured.out  # the summary still printed
    err = captured.err.strip().splitlines()
    assert err == [f"gpudiag: error: cannot write report {out}: No space left on device"]
    assert list(tmp_path.iterdir()) == []  # ...never left behind
