"""End to end: users' rules from pyproject.toml: catastrophic patterns and wrongly typed fields
refused in one line, an implicit pyproject others may write (or another user's) ignored, matching
bounded in time."""

from __future__ import annotations

from pathlib import Path

from tests.agent.test_user_rules import FIXTURE, _rules_file
from tests.conftest import gpudiag


def _replay_with_rules(tmp_path, rule: str, timeout: float = 60):
    """In a process of its own: a catastrophic pattern that slipped through would hang it,
    and the timeout ends it."""
    _rules_file(tmp_path, rule)
    fixture = Path(__file__).parents[3] / FIXTURE
    return gpudiag("replay", str(fixture), cwd=tmp_path, timeout=timeout)


def test_catastrophic_rule_patterns_are_refused_in_one_line(tmp_path):
    """`[[tool.gpudiag.rules]]` read from ./pyproject.toml without being named compiled
    `(a+)+b` and the like, which hang run, attach and replay on a long frame name."""
    for pattern in (
        r"(a+)+$",
        r"(a|aa)*$",
        r"\w*\w*\w*\w*!",
        r"(.*a){12}",
        r"(a)\1",
        "a" * 201,
    ):
        res = _replay_with_rules(tmp_path, f"function = '{pattern}'", timeout=30)
        assert res.returncode == 2, (pattern, res.stderr)
        assert res.stderr.count("\n") == 1 and "rule 1: function" in res.stderr, res.stderr
