"""End to end: `gpudiag run -- torchrun --nproc-per-node 2` on a tiny gloo job with a planted
straggler, a planted hang, or nothing wrong."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpudiag.agent.output.report import load_report
from tests.conftest import WORKLOADS, gpudiag
from tests.job_findings import busy_scaled

pytest.importorskip("torch")
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
JOB = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(WORKLOADS / "dist_train.py")]
# enough stack samples of each rank's loop in a short job on a shared 2-core machine
SAMPLING = ["--cpu-budget", "0", "--rate", "50", "--window", "2"]


def run_job(tmp_path: Path, env: dict[str, str], seconds: str = "10", *extra: str) -> dict:
    out = tmp_path / "r.json"
    res = gpudiag(
        "run", *SAMPLING, *extra, "--out", str(out), "--", *JOB, "--seconds", seconds,
        env={**os.environ, **env}, timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return load_report(str(out))


def why(doc: dict) -> str:
    keep = ("run", "ranks", "distributed", "errors", "probes", "metrics")
    return json.dumps({k: doc.get(k) for k in keep} | {"findings": doc["findings"]}, indent=1)


def test_slow_loader_on_rank_1_is_named_the_straggler(tmp_path, cli):
    rec = str(tmp_path / "rec.jsonl.gz")
    env = {"GPUDIAG_TEST_SLOW_RANK": "1", "GPUDIAG_TEST_DATA_DELAY": "0.1"}
    # 6 s of job on a quiet box (found in a shorter look), longer on a busy one
    doc = run_job(tmp_path, env, busy_scaled(6), "--record", rec)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1], why(doc)
    # the recording holds every rank; its replay rebuilds the main rank's view exactly (the
    # replay and the report below read files: in this process, as `cli` runs them)
    replay = json.loads(cli("replay", rec, "--format", "json").stdout)
    assert replay["breakdown"] == doc["breakdown"]
    assert all(r["world_size"] == 2 and r["pid"] for r in doc["ranks"])
    dist = [f for f in doc["findings"] if f["id"] == "DIST001"]
    assert dist, why(doc)
    assert "rank 1 on" in dist[0]["message"] and "DataLoader" in dist[0]["message"]
    assert doc["distributed"]["straggler"]["straggler"] == 1
    r0, r1 = doc["ranks"]
    assert r0["breakdown"]["collectives"] > r1["breakdown"]["collectives"]
    assert r1["breakdown"]["data"] > 0.3
    assert r0["collective_share_hooks"] > 0.3  # the in-process hooks saw the wait too
    assert any("flight recorder on" in n for n in doc["distributed"]["notes"])
    text = cli("report", str(tmp_path / "r.json")).stdout
    assert "<- straggler" in text and "Ranks (2)" in text


def kill_tree(pid: int) -> None:
    """Kill a launcher and every process below it: a hung rank may have left the launcher's
    process group, and would otherwise wait in its collective for gloo's 30-minute timeout."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@pytest.mark.long
def test_balanced_job_has_no_distributed_warning(tmp_path):
    doc = run_job(tmp_path, {})
    assert len(doc["ranks"]) == 2, why(doc)
    serious = [f["id"] for f in doc["findings"] if f["id"].startswith("DIST")]
    assert serious == [], why(doc)
    assert all(r["steps"] and r["steps"] > 10 for r in doc["ranks"]), why(doc)


def test_hang_report_is_written_while_hung_and_names_the_rank(tmp_path):
    out = tmp_path / "hang.json"
    env = {**os.environ, "GPUDIAG_TEST_HANG_RANK": "1", "GPUDIAG_TEST_HANG_STEP": "15"}
    cmd = [sys.executable, "-m", "gpudiag.agent.cli.main", "run", *SAMPLING, "--set",
           "dist_hang_s=4", "--out", str(out), "--", *JOB, "--seconds", "100"]  # fmt: skip
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.5)
        assert out.exists(), "no report while the job hung"
        assert p.poll() is None  # the job is still hung when the report is there
        doc = load_report(str(out))
    finally:
        kill_tree(p.pid)
        p.wait()
    hang = [f for f in doc["findings"] if f["id"] == "DIST002"]
    assert hang, why(doc)
    msg = hang[0]["message"]
    assert "Rank(s) 0 wait in all_reduce" in msg and "rank 1 is not in it" in msg, msg
    assert "wait_for_signal_file" in msg
    stacks = doc["distributed"]["hang"]["stacks"]
    assert any("all_reduce" in f for f in stacks["0"])
    assert any("wait_for_signal_file" in f for f in stacks["1"])


@pytest.mark.slow
def test_ddp_straggler_is_found_though_its_wait_hides_under_backward(tmp_path):
    doc = run_job(tmp_path, {"GPUDIAG_TEST_SLOW_RANK": "1", "GPUDIAG_TEST_DATA_DELAY": "0.1"})
    assert doc["distributed"]["straggler"].get("straggler") == 1, why(doc)


def two_ranks(pid: int) -> list:
    """The two ranks under the launcher `pid` once both run (waited for up to a minute), past
    their imports."""
    from gpudiag.probes.dist.ranks import find_ranks

    ranks: list = []
    deadline = time.monotonic() + 60
    while len(ranks) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        ranks = find_ranks(pid)
    assert len(ranks) == 2
    time.sleep(3)  # past the imports
    return ranks


@pytest.mark.long
def test_attach_to_one_rank_profiles_every_rank(tmp_path):
    job = subprocess.Popen(
        [*JOB, "--seconds", "40"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        ranks = two_ranks(job.pid)
        out = tmp_path / "a.json"
        res = gpudiag(
            "attach", str(ranks[1].pid), *SAMPLING, "--duration", "5", "--out", str(out),
            timeout=120,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        doc = load_report(str(out))
    finally:
        kill_tree(job.pid)
        job.wait()
    assert [r["rank"] for r in doc["ranks"]] == [0, 1], why(doc)
    assert {r["pid"] for r in doc["ranks"]} == {r.pid for r in ranks}
    assert all(r["stack_samples"] > 0 for r in doc["ranks"]), why(doc)
    assert doc["run"]["pid"] == ranks[1].pid  # the rank the user named leads the report


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload,lib", [("dist_lightning.py", "lightning"), ("dist_accelerate.py", "accelerate")]
)
def test_lightning_ddp_and_accelerate_straggler_under_torchrun(tmp_path, workload, lib):
    pytest.importorskip(lib)
    out = tmp_path / "r.json"
    job = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(WORKLOADS / workload), "10"]
    env = {**os.environ, "GPUDIAG_TEST_SLOW_RANK": "1", "GPUDIAG_TEST_DATA_DELAY": "0.1"}
    res = gpudiag("run", *SAMPLING, "--out", str(out), "--", *job, env=env, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = load_report(str(out))
    assert [r["rank"] for r in doc["ranks"]] == [0, 1], why(doc)
    assert doc["distributed"]["straggler"].get("straggler") == 1, why(doc)


DDP_JOB = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(WORKLOADS / "dist_ddp.py")]


def run_ddp(tmp_path: Path, env: dict[str, str], seconds: str, *extra: str) -> dict:
    out = tmp_path / "ddp.json"
    res = gpudiag(
        "run", *SAMPLING, *extra, "--out", str(out), "--", *DDP_JOB, "--seconds", seconds,
        env={**os.environ, **env}, timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return load_report(str(out))


@pytest.mark.parametrize(
    "plant,cause,seconds",
    [
        pytest.param("loop", "own loop work", "6", marks=pytest.mark.long),  # found in 6 s
        pytest.param("data", "DataLoader", "10", marks=pytest.mark.slow),
        pytest.param("backward", "own compute is slower", "10", marks=pytest.mark.slow),
    ],
)
def test_ddp_straggler_is_named_from_the_measured_allreduce_wait(tmp_path, plant, cause, seconds):
    # the issue's held-out case: rank 1 slow outside forward/backward/optimizer, rank 0's
    # wait inside DDP's all-reduce under backward (timed by gpudiag's comm hook)
    doc = run_ddp(tmp_path, {"GPUDIAG_TEST_PLANT": plant}, busy_scaled(float(seconds)))
    assert doc["distributed"]["straggler"].get("straggler") == 1, why(doc)
    assert "measured" in doc["distributed"]["straggler"]["basis"]
    f = next(f for f in doc["findings"] if f["id"] == "DIST001")
    assert cause in f["message"] and "dist_ddp.py:" in f["message"], f["message"]
    r0, r1 = doc["ranks"]
    assert r0["collective_share_hooks"] > r1["collective_share_hooks"] + 0.3


def start_hung(tmp_path: Path, env: dict[str, str], seconds: str, hang_s: str):
    out = tmp_path / "hang.json"
    opts = [*SAMPLING, "--set", f"dist_hang_s={hang_s}", "--out", str(out)]
    cmd = [
        sys.executable,
        "-m",
        "gpudiag.agent.cli.main",
        "run",
        *opts,
        "--",
        *DDP_JOB,
        "--seconds",
        seconds,
    ]
    p = subprocess.Popen(
        cmd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    return p, out


@pytest.mark.long
def test_ddp_rank_that_stops_calling_backward_is_named_hung(tmp_path):
    p, out = start_hung(tmp_path, {"GPUDIAG_TEST_PLANT": "hang"}, "100", "4")
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.5)
        assert out.exists(), "no report while the job hung"
        assert p.poll() is None
        doc = load_report(str(out))
    finally:
        kill_tree(p.pid)
        p.wait()
    assert len(doc.get("ranks") or []) == 2, why(doc)  # the ranks were followed
    hang = [f for f in doc["findings"] if f["id"] == "DIST002"]
    assert hang, why(doc)
    msg = hang[0]["message"]
    assert "Rank(s) 0 wait in DDP's gradient all-reduce" in msg and "rank 1 is not in it" in msg
    assert "dist_ddp.py" in msg and ":stalled" in msg, msg
    assert doc.get("distributed", {}).get("hang"), why(doc)
    assert doc["distributed"]["hang"]["collectives"]["0"]["inside"] == "ddp_allreduce"


@pytest.mark.long
def test_an_evaluation_longer_than_dist_hang_s_is_not_a_hang(tmp_path):
    # rank 0 evaluates 9 s (rank 1 6 s, then waits in a barrier); dist_hang_s=3. The first
    # evaluation starts at step 20 and the job ends at the step after it (--seconds 10)
    env = {"GPUDIAG_TEST_PLANT": "eval", "GPUDIAG_TEST_DELAY": "6"}
    p, out = start_hung(tmp_path, env, "10", "3")
    try:
        _, err = p.communicate(timeout=180)
    finally:
        kill_tree(p.pid)
    assert p.returncode == 0, err[-3000:]
    doc = load_report(str(out))
    assert not [f for f in doc["findings"] if f["id"] == "DIST002"], why(doc)
    notes = " ".join(doc["distributed"]["notes"])
    assert "rank 0 is evaluating" in notes or "no rank was inside a collective" in notes, why(doc)


def attach_ddp(tmp_path: Path, plant: str) -> dict:
    """`gpudiag attach` to rank 1 of the DDP job with `plant` on rank 1 (no hooks: the
    collectives' waits are not measured)."""
    env = {**os.environ, "GPUDIAG_TEST_PLANT": plant}
    job = subprocess.Popen([*DDP_JOB, "--seconds", "45"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        ranks = two_ranks(job.pid)
        out = tmp_path / "a.json"
        pid = next(r.pid for r in ranks if r.rank == 1)
        res = gpudiag("attach", str(pid), *SAMPLING, "--duration", "10", "--out", str(out),
                      timeout=150)  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        return load_report(str(out))
    finally:
        kill_tree(job.pid)
        job.wait()


@pytest.mark.slow
def test_attach_to_a_ddp_job_slow_in_its_own_backward_is_undecided_not_balanced(tmp_path):
    """Measured 10 of 10 undecided (benchmarks/dist_verdicts.py): the stacks of a rank slow in
    its backward and of the rank waiting in DDP's all-reduce under backward look alike."""
    doc = attach_ddp(tmp_path, "backward")
    dec = doc["distributed"]["straggler"]
    assert not dec["decided"] and "DDP" in dec["reason"], why(doc)
    assert all(r["ddp"] for r in doc["ranks"]), why(doc)
    assert not [f for f in doc["findings"] if f["id"] == "DIST001"]


@pytest.mark.slow
def test_attach_names_a_ddp_straggler_slow_in_its_own_loop_work(tmp_path):
    """Measured 10 of 10 (benchmarks/dist_verdicts.py); before the stack loop window took a
    quarter of loop work, the straggler's own work cut its window and 1 look in 7 abstained."""
    doc = attach_ddp(tmp_path, "loop")
    dec = doc["distributed"]["straggler"]
    assert dec.get("straggler") == 1, why(doc)
    f = next(f for f in doc["findings"] if f["id"] == "DIST001")
    assert "own loop work" in f["message"]
