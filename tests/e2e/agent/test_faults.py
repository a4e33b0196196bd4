"""End to end: faults gpudiag must survive: a probe that hangs, py-spy missing, denied or crashing,
NVML failing mid-run, a full disk or a vanished output folder. Each leaves a report (or, where the
report itself cannot be written, one clear error and the summary)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time

import pytest

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.output.render.text import render_text
from gpudiag.agent.output.report import report_of, validate
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts, make_probes
from gpudiag.probes.base import Field, Probe, ProbeStatus, Sample, Target
from gpudiag.probes.gpu.nvml import Nvml
from gpudiag.probes.gpu.probe import GpuProbe
from tests.agent.test_faults import FIXTURE
from tests.conftest import assert_one_line_error, gpudiag
from tests.e2e.agent.test_signals import wait_for
from tests.probes.fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_NOT_SUPPORTED,
    FakeGpu,
    FakeNvml,
)


def test_output_folder_gone_during_the_run(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudiag.agent.cli.main",
            "run",
            "--no-inject",
            "--out",
            str(folder / "r.json"),
            "--record",
            str(folder / "r.jsonl.gz"),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(4)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    head = wait_for(agent, "profiling pid")
    (folder / "r.jsonl.gz").unlink()
    folder.rmdir()
    out, err = agent.communicate(timeout=60)
    err = head + err
    res = subprocess.CompletedProcess(agent.args, agent.returncode, out, err)
    assert "Probes:" in out  # the summary still printed
    assert_one_line_error(
        subprocess.CompletedProcess(
            agent.args,
            agent.returncode,
            out,
            "\n".join(ln for ln in err.splitlines() if "error:" in ln),
        ),
        "cannot write report",
        "No such file or directory",
    )
    assert "Traceback" not in res.stderr


def test_unwritable_report_folder_is_refused_before_starting(tmp_path):
    assert_one_line_error(
        gpudiag("run", "--out", str(tmp_path / "no" / "r.json"), "--", "true"), "does not exist"
    )
    assert_one_line_error(gpudiag("run", "--out", str(tmp_path), "--", "true"), "is a directory")


def test_recording_cut_by_a_full_disk_still_replays(tmp_path):
    """What reached the disk before it filled up is a valid (cut short) recording."""
    data = FIXTURE.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(gzip.decompress(data)[:200_000]))
    res = gpudiag("replay", str(cut), "--format", "json")
    assert res.returncode in (0, 2) and "Traceback" not in res.stderr


CHURN = """
import multiprocessing as mp, os, signal, time
def work(i):
    time.sleep(0.3)
    return i
if __name__ == "__main__":
    done = []
    with mp.Pool(2, maxtasksperchild=1) as pool:  # every task a new worker process
        for i in range(12):
            pool.apply_async(work, (i,), callback=done.append)
        time.sleep(1.5)
        os.kill(pool._pool[0].pid, signal.SIGKILL)  # a worker dies; the pool replaces it
        t = time.time()  # the killed worker's task is lost: every other one comes back
        while len(done) < 11 and time.time() - t < 30:
            time.sleep(0.1)
    time.sleep(0.5)
"""


def test_workers_dying_and_replaced_keep_every_probe_going(tmp_path):
    script = tmp_path / "churn.py"
    script.write_text(CHURN)
    out = tmp_path / "r.json"
    res = gpudiag("run", "--no-inject", "-q", "--out", str(out), "--", sys.executable, str(script))
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    validate(doc)
    assert doc["run"]["end_reason"] == "target_exited" and doc["run"]["exit_code"] == 0
    assert not [e for e in doc["errors"] if "stopped sampling" in e["message"]], doc["errors"]
    status = {p["name"]: p for p in doc["probes"]}
    assert status["process"]["available"] and status["stacks"]["available"]


DATALOADER_CHURN = """
import os, signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.full((4,), float(i))

if __name__ == "__main__":
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(), batch_size=4, num_workers=2)
    killed = restarts = steps = 0
    for epoch in range(3):
        it = iter(loader)
        while True:
            # DataLoader's SIGCHLD handler raises the dead worker's error wherever the loop
            # is (in the forward too, not only in next()): the whole step is in the try
            try:
                batch = next(it)
                opt.zero_grad()
                model(batch).sum().backward()
                opt.step()
            except StopIteration:
                break
            except RuntimeError as exc:  # a worker died: new workers, the epoch goes on
                print("worker died:", str(exc)[:80], file=sys.stderr, flush=True)
                restarts += 1
                it = iter(loader)
                continue
            steps += 1
            if epoch == 1 and steps % 16 == 3 and killed < 2:
                os.kill(it._workers[0].pid, signal.SIGKILL)  # mid-epoch
                killed += 1
    print(f"steps={steps} restarts={restarts}", file=sys.stderr, flush=True)
    sys.exit(0 if restarts >= 1 else 5)
"""


@pytest.mark.long
def test_dataloader_workers_dying_and_replaced_mid_epoch(tmp_path):
    """Issue 23 #9: worker churn with a real torch DataLoader (not a multiprocessing.Pool):
    every probe keeps sampling, the report is complete and the job's exit code stands."""
    pytest.importorskip("torch")
    script = tmp_path / "churn_loader.py"
    script.write_text(DATALOADER_CHURN)
    out = tmp_path / "r.json"
    res = gpudiag("run", "-q", "--out", str(out), "--", sys.executable, str(script), timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "worker died" in res.stderr and "restarts=" in res.stderr
    doc = json.loads(out.read_text())
    validate(doc)
    assert doc["run"]["end_reason"] == "target_exited" and doc["run"]["exit_code"] == 0
    assert not [e for e in doc["errors"] if "stopped sampling" in e["message"]], doc["errors"]
    status = {p["name"]: p for p in doc["probes"]}
    assert status["process"]["available"] and status["stacks"]["available"]
    assert status["hooks"]["available"], status["hooks"]


def _second_user() -> str:
    """A real second (unprivileged) user to run gpudiag as: made with useradd if needed."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run as two real users")
    name = "gpudiag-other"
    if subprocess.run(["id", name], capture_output=True).returncode:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
        )
        if made.returncode:
            pytest.skip(f"cannot add a user: {made.stderr.decode()[:200]}")
    return name


def test_another_real_users_process_is_refused(tmp_path):
    """Issue 23 #9: a job of user `nobody`, gpudiag run as another real user (setpriv, not a
    faked uid): one line saying whose process it is, exit 2."""
    user = _second_user()
    as_ = ["setpriv", "--clear-groups"]
    job = subprocess.Popen(
        [
            *as_,
            "--reuid",
            "nobody",
            "--regid",
            "nogroup",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
        ]
    )
    try:
        time.sleep(0.5)
        runs = [
            subprocess.run(
                [
                    *as_,
                    "--reuid",
                    user,
                    "--regid",
                    user,
                    sys.executable,
                    "-m",
                    "gpudiag.agent.cli.main",
                    "attach",
                    str(job.pid),
                    "--duration",
                    "2",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=cwd,  # "/"; and a folder this user cannot search (was an internal error)
            )
            for cwd in ("/", tmp_path)
        ]
    finally:
        job.kill()
        job.wait()
    for res in runs:
        assert_one_line_error(res, f"pid {job.pid} belongs to user 'nobody'", "uid")
    assert job.returncode == -9  # the job was never touched until the test ended it


@pytest.fixture
def sleeper():
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.3)
    yield job
    job.kill()
    job.wait()


class Ticker(Probe):
    """A healthy probe: one sample per tick."""

    name, interval_s = "host", 0.1
    fields = (Field("n", "count", "gauge", "ticks"),)

    def __init__(self) -> None:
        self.ticks = 0

    def open(self, target: Target) -> ProbeStatus:
        return ProbeStatus(self.name, True)

    def sample(self) -> list[Sample]:
        self.ticks += 1
        return [Sample(self.name, time.time_ns(), {}, {"n": float(self.ticks)})]

    def close(self) -> None:
        pass


class Hanger(Ticker):
    """A probe whose second sample never returns (a hung driver call)."""

    name = "gpu"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def sample(self) -> list[Sample]:
        if self.ticks >= 1:
            self.release.wait()
        return super().sample()

    def close(self) -> None:
        raise AssertionError("a hung probe's close() must not be called")


def session(pid: int, probes: list, **opts) -> Session:
    return Session(
        Target(pid),
        load_settings(None),
        SessionOptions(progress=False, cpu_budget=None, **opts),
        SessionParts(probes=probes),
    )


def test_a_hung_probe_is_timed_out_and_the_others_keep_sampling(sleeper):
    ticker, hanger = Ticker(), Hanger()
    s = session(sleeper.pid, [ticker, hanger], duration_s=3.0, probe_timeout_s=1.0)
    try:
        result = s.run()
    finally:
        hanger.release.set()
    status = {p.name: p for p in result.probes}
    assert not status["gpu"].available and "timed out" in (status["gpu"].reason or "")
    assert status["host"].available
    assert any(e["source"] == "gpu" and "timed out" in e["message"] for e in result.errors)
    assert ticker.ticks >= 10  # the healthy probe went on sampling through the hang


class RankHanger(Hanger):
    """A hung rank stack probe: its name has a dash, as the ranks' probes do."""

    name = "stacks-rank1"


def test_a_hung_rank_probe_is_not_waited_for_at_the_end(sleeper):
    """The end joined every probe thread not hung, telling them apart by the thread name's
    last '-' part: 'rank1' for 'gpudiag-stacks-rank1', never in the hung set, so a hung rank
    probe held the report for the full 20 s join."""
    hanger = RankHanger()
    s = session(sleeper.pid, [Ticker(), hanger], duration_s=2.0, probe_timeout_s=0.5)
    t0 = time.monotonic()
    try:
        result = s.run()
    finally:
        hanger.release.set()
    assert "stacks-rank1" in s.hung
    assert time.monotonic() - t0 < 15  # not the 20 s join
    assert any(e["source"] == "stacks-rank1" for e in result.errors)


FAKE_SPY = {
    "denied": 'echo "Error: Permission denied (os error 13)" >&2; exit 1',
    "crash": 'if [ "$1" = dump ]; then exit 0; fi\n'
    "echo \"thread 'main' panicked at 'index out of bounds'\" >&2; exit 101",
}


@pytest.mark.parametrize(
    "mode, reason, fix",
    [
        ("missing", "py-spy executable not found", "pip install py-spy"),
        ("denied", "no permission", "--cap-add SYS_PTRACE"),
        ("crash", "py-spy crashed (exit code 101)", "pip install -U py-spy"),
    ],
)
def test_py_spy_missing_denied_or_crashing(monkeypatch, tmp_path, sleeper, mode, reason, fix):
    exe = None
    if mode in FAKE_SPY:
        exe = tmp_path / "py-spy"
        exe.write_text("#!/bin/sh\n" + FAKE_SPY[mode] + "\n")
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr("gpudiag.probes.stacks.probe.find_py_spy", lambda: exe and str(exe))
    opts = SessionOptions(duration_s=3.0, window_s=1.0, progress=False, cpu_budget=None)
    s = Session(
        Target(sleeper.pid), load_settings(None), opts, SessionParts(probes=make_probes(opts)[:3])
    )
    result = s.run()
    doc = report_of(result, mode="attach", command=None, pid=sleeper.pid, settings=s.settings)
    validate(doc)
    stacks = next(p for p in doc["probes"] if p["name"] == "stacks")
    assert not stacks["available"]
    assert reason in stacks["reason"] and fix in stacks["hint"]
    assert doc["findings"] == []  # no guessing without stacks
    text = render_text(doc)
    assert "the findings that need stacks cannot be made" in text and fix in text
    if mode == "denied":
        assert "kernel.yama" in stacks["hint"] or "ptrace_scope" in stacks["hint"]


@pytest.mark.parametrize(
    "function, error, words",
    [
        # a MIG slice or driver that stops supporting a call: degraded, the call named
        (
            "nvmlDeviceGetUtilizationRates",
            NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetUtilizationRates",
        ),
        # the driver reloaded under the job: the GPU is recorded as lost
        ("nvmlDeviceGetPowerUsage", NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    ],
)
def test_nvml_failing_mid_run_is_recorded_and_degraded(sleeper, function, error, words):
    gpu = FakeGpu(job_pids=[sleeper.pid])
    fake = FakeNvml([gpu])
    threading.Timer(1.2, lambda: gpu.errors.update({function: error})).start()
    s = session(sleeper.pid, [GpuProbe(Nvml(fake))], duration_s=3.0)
    result = s.run()
    doc = report_of(result, mode="attach", command=None, pid=sleeper.pid, settings=s.settings)
    validate(doc)
    gpu_status = next(p for p in doc["probes"] if p["name"] == "gpu")
    said = json.dumps(doc["errors"]) + json.dumps(gpu_status)
    assert words.lower() in said.lower(), said
    assert result.timeline.matching("gpu", "util_gpu", gpu="0")  # sampled before it failed


def test_probe_ingest_goes_on_while_a_live_analysis_runs(sleeper, monkeypatch):
    """A live view's analysis runs on a copy of the timeline taken under the lock, never
    holding the lock the probes' ingest takes (it used to analyse under it)."""
    from gpudiag.agent.session import session as session_mod

    started, release = threading.Event(), threading.Event()
    real = session_mod.analyze

    def slow_analyze(*a, **k):
        started.set()
        assert release.wait(10), "ingest was blocked behind the analysis"
        return real(*a, **k)

    monkeypatch.setattr(session_mod, "analyze", slow_analyze)
    s = session(sleeper.pid, [Ticker()], duration_s=1.0)
    s._ingest(Ticker().sample())
    live = threading.Thread(target=s.snapshot)
    live.start()
    assert started.wait(10)
    t0 = time.monotonic()
    s._ingest(Ticker().sample())  # a probe's samples land while the analysis waits
    ingest_s = time.monotonic() - t0
    release.set()
    live.join(10)
    assert ingest_s < 1.0
    assert s.timeline.samples_seen == 2
