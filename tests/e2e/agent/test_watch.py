"""End to end: `gpudiag watch`: job discovery, the shared budget, and two real jobs on the box."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.agent.test_metrics import scrape
from tests.conftest import WORKLOADS
from tests.e2e.agent.test_metrics import free_port


def test_watch_bad_match_is_one_line_and_exit_2():
    from tests.conftest import gpudiag

    res = gpudiag("watch", "--match", "(", "--metrics-port", "0", "--duration", "1")
    assert res.returncode == 2 and res.stderr.startswith("gpudiag: error: --match")
    assert "Traceback" not in res.stderr


def _copy_job(tmp_path, name: str) -> str:
    shutil.copy(WORKLOADS / "_common.py", tmp_path / "_common.py")
    shutil.copy(WORKLOADS / "starved_loader.py", tmp_path / name)
    return str(tmp_path / name)


def _info(fams: dict) -> dict[str, dict]:
    """job label -> the pid and command gpudiag_job_info gives it."""
    return {s.labels["job"]: s.labels for s in fams.get("gpudiag_job_info", [])}


def _pids(fams: dict, family: str = "gpudiag_finding_impact_ratio") -> dict[str, set[str]]:
    """pid -> the findings (via the job label: the series carry no pid)."""
    info = _info(fams)
    out: dict[str, set[str]] = {}
    for s in fams.get(family, []):
        pid = info[s.labels["job"]]["pid"]
        out.setdefault(pid, set()).add(s.labels.get("finding", ""))
    return out


def test_watch_shows_two_jobs_and_drops_the_one_that_ends(tmp_path):
    pytest.importorskip("torch")
    short = subprocess.Popen(
        [sys.executable, _copy_job(tmp_path, "job_a.py"), "--seconds", "150"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    long = subprocess.Popen(
        [sys.executable, _copy_job(tmp_path, "job_b.py"), "--seconds", "150"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port = free_port()
    watch = subprocess.Popen(
        [sys.executable, "-m", "gpudiag.agent.cli.main", "watch", "--metrics-port", str(port)]
        + ["--match", re.escape(str(tmp_path)), "--interval", "1", "--window", "1"]
        + ["--cpu-budget", "0", "--duration", "170"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    a, b = str(short.pid), str(long.pid)
    try:
        both: dict = {}
        # both jobs, each with its own findings: waited for (a busy box takes longer), not
        # for a fixed time; the short job ends only after that
        for _ in range(120):
            time.sleep(1)
            try:
                both = _pids(scrape(url))
            except OSError:
                continue
            if all(both.get(p, set()) & {"DATA001", "DATA002"} for p in (a, b)):
                break
        assert {a, b} <= set(both), both
        assert both[a] & {"DATA001", "DATA002"} and both[b] & {"DATA001", "DATA002"}
        fams = scrape(url)
        commands = {i["pid"]: i["command"] for i in _info(fams).values()}
        assert "job_a.py" in commands[a] and "job_b.py" in commands[b]
        short.terminate()  # the short job ends
        short.wait(timeout=30)
        gone: dict = {}
        for _ in range(20):  # the ended job disappears; the other stays
            time.sleep(1)
            fams = scrape(url)
            gone = _pids(fams, "gpudiag_job_profiled_seconds")
            if a not in gone:
                break
        assert a not in gone and b in gone, gone
        assert fams["gpudiag_jobs_watched"][0].value == 1
        assert a not in _pids(fams)
    finally:
        for p in (short, long):
            p.kill()
            p.wait()
        watch.terminate()  # SIGTERM: stops cleanly
        assert watch.wait(timeout=60) == 0, watch.stderr.read()


@pytest.mark.long
def test_watch_shows_a_torchrun_job_once_with_its_ranks(tmp_path):
    """The launcher is the job (its ranks are not jobs of their own); its ranks are profiled
    as `attach` does, so the straggler finding reaches the metrics."""
    pytest.importorskip("torch")
    import os
    from pathlib import Path

    shutil.copy(WORKLOADS / "dist_train.py", tmp_path / "dist_train.py")
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "GPUDIAG_TEST_SLOW_RANK": "1", "GPUDIAG_TEST_DATA_DELAY": "0.1"}
    job = subprocess.Popen(
        [torchrun, "--standalone", "--nproc-per-node", "2", str(tmp_path / "dist_train.py")]
        + ["--seconds", "60"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    port = free_port()
    watch = subprocess.Popen(
        [sys.executable, "-m", "gpudiag.agent.cli.main", "watch", "--metrics-port", str(port)]
        + ["--match", re.escape(str(tmp_path)), "--interval", "1", "--window", "2"]
        + ["--cpu-budget", "0", "--rate", "50", "--duration", "70"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        jobs: dict = {}
        for _ in range(60):
            time.sleep(1)
            try:
                jobs = _pids(scrape(url))
            except OSError:
                continue
            if "DIST001" in jobs.get(str(job.pid), set()):
                break
        assert set(jobs) == {str(job.pid)}, jobs  # one job: the launcher, not each rank
        assert "DIST001" in jobs[str(job.pid)], jobs
    finally:
        os.killpg(job.pid, 9)
        job.wait()
        watch.terminate()
        assert watch.wait(timeout=60) == 0, watch.stderr.read()
