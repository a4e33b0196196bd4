"""End to end: secrets on the job's command line never reach a report, a recording or gpudiag's
lines."""

from __future__ import annotations

import gzip
import json
import sys

from gpudiag.text.redact import (
    MASK,
)
from tests.agent.test_redaction import SECRET
from tests.conftest import gpudiag

# the job fails (so its stderr tail goes into the report) after echoing its secret
JOB = (
    "import sys, time; time.sleep(1.0); "
    "print('auth failed for --api-key', sys.argv[2], file=sys.stderr); "
    "sys.exit(3 if sys.argv[2].endswith('SECRET') else 4)"
)


def test_run_report_and_recording_hide_the_api_key(tmp_path):
    out, rec = tmp_path / "r.json", tmp_path / "r.jsonl.gz"
    res = gpudiag(
        "run",
        "--no-inject",
        "--out",
        str(out),
        "--record",
        str(rec),
        "--",
        sys.executable,
        "-c",
        JOB,
        "--api-key",
        SECRET,
        "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz",
    )
    assert res.returncode == 3, res.stderr  # the job itself got the real key
    report = out.read_text()
    recording = gzip.decompress(rec.read_bytes()).decode()
    for text in (report, recording, res.stdout):
        assert SECRET not in text and "hf_abcdefghijklmnopqrstuvwxyz" not in text
    doc = json.loads(report)
    assert doc["run"]["command"][-3:] == ["--api-key", MASK, "HF_TOKEN=" + MASK]
    assert any("auth failed for --api-key ***" in ln for ln in doc["run"]["stderr_tail"])
    assert "--api-key ***" in res.stderr  # gpudiag's own "profiling pid" line
    replayed = gpudiag("replay", str(rec), "--format", "json")
    assert replayed.returncode == 0, replayed.stderr
    assert SECRET not in replayed.stdout
