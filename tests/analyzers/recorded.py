"""The workloads' recordings (tests/fixtures/workloads), replayed as `gpudiag replay` reports
them."""

from __future__ import annotations

from pathlib import Path

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.commands.replay import replay_report

WORKLOAD_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "workloads"


def replay_workload(name: str) -> dict:
    """The report of tests/fixtures/workloads/NAME.jsonl.gz, with the default settings."""
    return replay_report(str(WORKLOAD_FIXTURES / f"{name}.jsonl.gz"), load_settings(None))
