"""Snapshots of each screen at 80x24, 100x30 and 160x48 (pytest-textual-snapshot).

Regenerate after an intended change with: pytest tests/tui --snapshot-update
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_textual_snapshot")

from tests.tui.snapshot_apps import app  # noqa: E402

SCENARIOS = ["starved", "healthy", "no_gpu", "throttled", "two_gpus", "hooked"]
SIZES = pytest.mark.parametrize(
    "size", [(80, 24), (100, 30), (160, 48)], ids=["80x24", "100x30", "160x48"]
)


@SIZES
@pytest.mark.parametrize("name", SCENARIOS)
def test_diagnosis_screen(snap_compare, name, size):
    assert snap_compare(app(name), terminal_size=size)


@SIZES
@pytest.mark.parametrize("name", ["starved", "hooked"])
def test_finding_detail_screen(snap_compare, name, size):
    assert snap_compare(app(name), press=["enter"], terminal_size=size)


@pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=["80x24", "100x30"])
def test_help_screen(snap_compare, size):
    assert snap_compare(app("starved"), press=["question_mark"], terminal_size=size)
