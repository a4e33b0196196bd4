"""What a report says of the job, apart from what it truly says of a busy box.

An end-to-end test runs a real job on a box shared with other work (a CI runner, the other
tests, the `busy_core` fixture). There gpudiag rightly adds HOST002 when processes outside the
job take the CPU its loop needs. A test of a planted cause asserts that the cause is named and
ranked first among the job's own causes, and accepts that true reading of the box: a HOST002
whose evidence names processes, none of them the job's. A HOST002 naming no process, or one of
the job's own, stays in the list (and fails a test that expects none).

A test that truly needs a quiet box says so with `quiet_box_or_skip()`: the box is measured
first and the test skips, with the measured load as the reason, where it is busy.
"""

from __future__ import annotations

import os
import re

import pytest

BOX_IDS = frozenset({"HOST002"})  # findings of the box around the job, not of the job
_NAMED = re.compile(r"^other_cpu_cores\[(\d+) ")  # HOST002's evidence per named process


def job_pids(doc: dict) -> set[int]:
    """The pids the report gives the job: its main process and its ranks."""
    pids = {(doc.get("run") or {}).get("pid")}
    pids |= {r.get("pid") for r in doc.get("ranks") or []}
    return {p for p in pids if isinstance(p, int)}


def named_outside(f: dict, doc: dict) -> bool:
    """Whether a box-level finding names the processes that take the CPU, all outside the job."""
    if f["id"] not in BOX_IDS:
        return False
    named = [int(m.group(1)) for e in f["evidence"] if (m := _NAMED.match(e["metric"]))]
    return bool(named) and not set(named) & job_pids(doc)


def job_findings(doc: dict, serious: bool = False) -> list[dict]:
    """The report's findings in rank order, less HOST002 where it names processes outside the
    job; with `serious`, only warnings and errors."""
    out = [f for f in doc["findings"] if not named_outside(f, doc)]
    if serious:
        out = [f for f in out if f["severity"] in ("warning", "error")]
    return out


def job_ids(doc: dict, serious: bool = False) -> list[str]:
    """The ids of `job_findings(doc, serious)`."""
    return [f["id"] for f in job_findings(doc, serious)]


def first_job_finding(doc: dict, fid: str) -> dict:
    """The job's first-ranked finding, asserted to be `fid` (the planted cause)."""
    found = job_findings(doc)
    assert found and found[0]["id"] == fid, [(f["id"], f["impact"]) for f in doc["findings"]]
    return found[0]


def load_per_core() -> float:
    """The box's 1-minute load average per core, read now."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def busy_scaled(seconds: float, most: float = 3.0) -> str:
    """A job's length for a test whose verdict needs enough of its loop sampled: `seconds` on a
    quiet box, up to `most` times that where the box is busy (the 1-minute load per core, read
    now): a starved sampler then still sees the loop long enough. As a command-line argument."""
    return f"{seconds * min(most, max(1.0, load_per_core())):.0f}"


def quiet_box_or_skip(max_per_core: float = 0.75) -> None:
    """Skip the calling test, with the measured load as the reason, unless the box is quiet
    (a 1-minute load average per core at most `max_per_core`): for a test that truly needs it."""
    load = load_per_core()
    if load > max_per_core:
        pytest.skip(
            f"needs a quiet box: load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores ({load:.2f} per core > {max_per_core})"
        )
