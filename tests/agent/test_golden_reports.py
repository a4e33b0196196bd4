"""Every report of the kept recordings (the eleven H100 runs, the planted workloads, the
public scripts), in every output format, byte for byte as the digests hold them: a refactor
changes none; a change to a conclusion updates the digests on purpose (see
tests/fixtures/workloads/README.md)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from gpudiag.analyzers.model.thresholds import Thresholds

ROOT = Path(__file__).resolve().parents[2]
DIGESTS = ROOT / "tests" / "fixtures" / "golden_digests.json"


def golden_script():
    """scripts/golden_reports.py as a module."""
    spec = importlib.util.spec_from_file_location("golden", ROOT / "scripts" / "golden_reports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """Every output of every kept recording, written once for this module's tests."""
    out = tmp_path_factory.mktemp("golden")
    golden_script().write_every(out, golden_script().recordings())
    return out


def test_every_report_of_the_kept_recordings_is_unchanged(written):
    golden = golden_script()
    got, want = golden.digests(written), json.loads(DIGESTS.read_text())
    changed = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    assert not changed, f"outputs changed: {changed[:8]} ({len(changed)} in all)"
    assert got.keys() == want.keys(), sorted(got.keys() ^ want.keys())


def absurd(f: dict, limit: float) -> str | None:
    """Why a finding's speed-up is unbounded or absurd, or None: not a finite number, under
    x1, at the x100 a step shrunk to nothing reads, or a bound above `limit` (bound_max)."""
    speed = f.get("expected_speedup")
    if not isinstance(speed, (int, float)) or not math.isfinite(speed):
        return f"speed-up {speed!r} is not a finite number"
    if speed < 1.0 or speed >= 100.0:
        return f"speed-up x{speed:g} (under x1, or the formula's x100 ceiling)"
    if f.get("speedup_kind") == "bound" and speed > limit:
        return f"bound x{speed:g} above bound_max x{limit:g}"
    low = f.get("speedup_low")
    if low is not None and not 0 < low <= speed:
        return f"low end x{low:g} outside (0, x{speed:g}]"
    return None


def test_no_report_of_the_kept_recordings_has_an_unbounded_or_absurd_speedup(written):
    """LitServe's front end attached to read LOOP001 'up to x100' (issue 54): every finding of
    every kept recording is checked."""
    limit = Thresholds().bound_max
    reports = sorted(written.rglob("report.json"))
    assert len(reports) == len(golden_script().recordings())
    bad = [
        f"{p.parent.relative_to(written)}: {f['id']} {why}"
        for p in reports
        for f in json.loads(p.read_text())["findings"]
        if (why := absurd(f, limit)) is not None
    ]
    assert not bad, bad[:8]


@pytest.mark.parametrize(
    "finding, ok",
    [
        ({"expected_speedup": 100.0, "speedup_kind": "bound"}, False),
        ({"expected_speedup": float("inf"), "speedup_kind": "model"}, False),
        ({"expected_speedup": None}, False),
        ({"expected_speedup": 25.0, "speedup_kind": "bound"}, False),
        ({"expected_speedup": 25.0, "speedup_kind": "model"}, True),
        ({"expected_speedup": 7.8, "speedup_kind": "bound"}, True),
        ({"expected_speedup": 1.5, "speedup_low": 1.8, "speedup_kind": "hypothesis"}, False),
    ],
)
def test_the_walk_catches_what_it_names(finding, ok):
    assert (absurd(finding, Thresholds().bound_max) is None) == ok
