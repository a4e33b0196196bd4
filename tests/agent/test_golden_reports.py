"""Every report of the kept recordings (the eleven H100 runs, the planted workloads, the
public scripts), in every output format, byte for byte as the digests hold them: a refactor
changes none; a change to a conclusion updates the digests on purpose (see
tests/fixtures/workloads/README.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = ROOT / "tests" / "fixtures" / "golden_digests.json"


def golden_script():
    """scripts/golden_reports.py as a module."""
    spec = importlib.util.spec_from_file_location("golden", ROOT / "scripts" / "golden_reports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_report_of_the_kept_recordings_is_unchanged(tmp_path):
    golden = golden_script()
    golden.write_every(tmp_path, golden.recordings())
    got, want = golden.digests(tmp_path), json.loads(DIGESTS.read_text())
    changed = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    assert not changed, f"outputs changed: {changed[:8]} ({len(changed)} in all)"
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())
