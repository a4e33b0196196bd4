"""`gpudiag demo` shows its planted cause every time on a busy 2-core box: it profiles the
loop (from the first step), with the hooks on, until the verdict is sure, and says what it
found in one line (issue 26, item 1)."""

from __future__ import annotations

import re

from gpudiag.agent.commands.demo import DemoClock, found_line
from tests.agent.test_report import make_doc

# the loader-bound cause: one id (DATA001) whatever the idle cores
LOADER_BOUND = re.compile(r"^Found: loader-bound: DATA001 ", re.M)


def test_found_line_names_the_cause_or_says_there_is_none():
    doc = make_doc()
    line = found_line(doc, DemoClock(reason="sure after 8 s of loop"))
    assert LOADER_BOUND.match(line) and "(sure after 8 s of loop)" in line
    doc["findings"] = []
    assert found_line(doc, DemoClock()).startswith("Found: no sure cause")
