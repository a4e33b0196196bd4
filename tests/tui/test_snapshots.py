"""Snapshots of each screen at 80x24 and 160x48 (pytest-textual-snapshot).

Regenerate after an intended change with: pytest tests/tui --snapshot-update
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_textual_snapshot")

from tests.tui.snapshot_apps import app  # noqa: E402

SCENARIOS = ["starved", "healthy", "no_gpu", "throttled", "two_gpus"]


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
@pytest.mark.parametrize("name", SCENARIOS)
def test_diagnosis_screen(snap_compare, name, size):
    assert snap_compare(app(name), terminal_size=size)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_finding_detail_screen(snap_compare, size):
    assert snap_compare(app("starved"), press=["enter"], terminal_size=size)
