"""tests/job_findings.py: a HOST002 is set apart from the job's findings only where its
evidence names processes, none of them the job's."""

from __future__ import annotations

import pytest

from tests.job_findings import first_job_finding, job_ids, quiet_box_or_skip


def _host002(*pids: int) -> dict:
    named = [{"metric": f"other_cpu_cores[{p} python]", "value": 0.9} for p in pids]
    return {
        "id": "HOST002",
        "severity": "error",
        "impact": 0.8,
        "evidence": [{"metric": "other_processes_cpu_cores", "value": 1.0}, *named],
    }


def _doc(*findings: dict, pid: int = 100, ranks: tuple[int, ...] = ()) -> dict:
    return {
        "run": {"pid": pid},
        "ranks": [{"pid": r} for r in ranks],
        "findings": list(findings),
    }


PADDING = {"id": "INFER003", "severity": "warning", "impact": 0.7, "evidence": []}
NOTE = {"id": "START001", "severity": "note", "impact": 0.0, "evidence": []}


def test_a_host002_naming_processes_outside_the_job_is_the_boxs():
    doc = _doc(_host002(555, 556), PADDING, NOTE)
    assert job_ids(doc) == ["INFER003", "START001"]
    assert job_ids(doc, serious=True) == ["INFER003"]
    assert first_job_finding(doc, "INFER003") is PADDING


def test_a_host002_naming_the_job_or_no_process_stays_the_jobs():
    assert job_ids(_doc(_host002(100), PADDING))[0] == "HOST002"  # the job's own pid
    assert job_ids(_doc(_host002(555, 7), PADDING, ranks=(7,)))[0] == "HOST002"  # a rank
    assert job_ids(_doc(_host002(), PADDING))[0] == "HOST002"  # names no process
    with pytest.raises(AssertionError):
        first_job_finding(_doc(_host002(100), PADDING), "INFER003")


def test_a_quiet_box_test_skips_with_the_measured_load(monkeypatch):
    monkeypatch.setattr("os.getloadavg", lambda: (6.0, 5.0, 4.0))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with pytest.raises(pytest.skip.Exception, match=r"load average 6\.0 on 2 cores \(3\.00"):
        quiet_box_or_skip()
    monkeypatch.setattr("os.getloadavg", lambda: (1.0, 1.0, 1.0))
    quiet_box_or_skip()  # 0.5 per core: quiet
