"""`attach --hooks` on real jobs: run's hooks loaded into a running process by pyinjector or
gdb (Python 3.10-3.13) or sys.remote_exec (3.14+), the handshake, a job stuck in C, a failing
install step never reaching the job, the job's own arithmetic untouched, and the exact
numbers `run` gets.

Only the venv's Python has torch here: the training jobs run on it, and the injection itself
is tested on every Python 3.10-3.13 under ~/.pyenv/versions with a torch-free job.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag.agent.session.hookload import load_hooks
from gpudiag.probes.base import Target
from gpudiag.probes.inprocess.channel import INJECT_DIR, LOADED, HookProbe
from gpudiag.probes.inprocess.loader import script_text
from tests.conftest import WORKLOADS, gpudiag, hooks_cannot_load
from tests.e2e.agent.test_e2e_workloads import loader_finding
from tests.job_findings import first_job_finding

needs_injector = pytest.mark.skipif(
    hooks_cannot_load() is not None,
    reason=f"attach --hooks needs pyinjector or gdb: {hooks_cannot_load()}",
)
BY = r"by (pyinjector|gdb) \(Python 3\.{minor}\)"  # how the hooks got in, on 3.10-3.13
PYENV = Path.home() / ".pyenv" / "versions"
WHERE = f"{PYENV}/3.1x.y or the running interpreter"


def _python(minor: int) -> str | None:
    """An interpreter of Python 3.`minor` on this machine, or None."""
    if sys.version_info[:2] == (3, minor):
        return sys.executable
    found = sorted(PYENV.glob(f"3.{minor}.*/bin/python3.{minor}"))
    return str(found[-1]) if found else None


def _torch_python(minor: int) -> str | None:
    """An interpreter of Python 3.`minor` with torch: the running one, or one named in
    GPUDIAG_TEST_PYTHONS (colon-separated paths; pyenv's interpreters have no torch)."""
    if sys.version_info[:2] == (3, minor):
        return sys.executable
    for path in filter(None, os.environ.get("GPUDIAG_TEST_PYTHONS", "").split(":")):
        out = subprocess.run(
            [path, "-c", "import sys, torch; print(sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode == 0 and out.stdout.strip() == str(minor):
            return path
    return None


def _job(python: str, code: str) -> subprocess.Popen:
    """A torch-free job that says `ready` once it runs its loop."""
    job = subprocess.Popen(
        [python, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert job.stdout is not None and job.stdout.readline().strip() == "ready"
    return job


SPIN_PYTHON = """
import os, sys, time
print("ready", flush=True)
t = time.time()
while time.time() - t < 60 and not os.path.exists({stop!r}):
    sum(i for i in range(1000))
m = sys.modules.get("gpudiag_hooks")
print("hooks", m is not None and m._state is not None, flush=True)
"""


def _probe(tmp_path: Path) -> HookProbe:
    probe = HookProbe(str(tmp_path / "rt" / "agent.sock"), optional=True)
    assert probe.open(Target(0)).available
    return probe


@needs_injector
@pytest.mark.parametrize("minor", [10, 11, 12, 13])
def test_the_hooks_get_into_a_running_job_and_a_second_attach_reuses_them(tmp_path, minor):
    python = _python(minor)
    if python is None:
        pytest.skip(f"no Python 3.{minor} here ({WHERE})")
    job = _job(python, SPIN_PYTHON.format(stop=str(tmp_path / "stop")))
    try:
        for second in (False, True):
            probe = _probe(tmp_path / str(second))
            try:
                st = load_hooks(probe, [job.pid])
            finally:
                probe.close()
            assert st.reason.startswith(LOADED), st
            assert re.search(BY.format(minor=minor), st.reason), st.reason
            assert "torch not imported yet" in st.reason  # they wait for its import
            assert ("reused" in st.reason) is second
        (tmp_path / "stop").touch()
        out, err = job.communicate(timeout=60)
        assert job.returncode == 0 and "hooks True" in out, err
        assert "Traceback" not in err
    finally:
        job.kill()
        job.wait()


@needs_injector
@pytest.mark.long
def test_a_job_spinning_in_c_is_left_after_the_wait_and_goes_on(tmp_path):
    code = (
        "print('ready', flush=True)\n"
        "sum(range(4 * 10**8))\n"  # seconds in one C call: no safe point for the script
        "print('done', flush=True)\n"
    )
    job = _job(sys.executable, code)
    probe = _probe(tmp_path)
    try:
        st = load_hooks(probe, [job.pid], wait_s=1.0)
        assert "no answer in 1 s" in st.reason, st
        assert "did not come back to Python" in st.reason and "native code" in st.reason
        assert "attach with --hooks again" in st.hint
        out, err = job.communicate(timeout=120)
        assert job.returncode == 0 and out.strip() == "done", err
        assert "Traceback" not in err and "SystemError" not in err
    finally:
        probe.close()
        job.kill()
        job.wait()


def test_python_314_uses_sys_remote_exec(tmp_path):
    python = _python(14)
    if python is None:
        pytest.skip(f"no Python 3.14 here ({WHERE}): the sys.remote_exec path is not tested")
    job = _job(python, SPIN_PYTHON.format(stop=str(tmp_path / "stop")))
    probe = _probe(tmp_path)
    try:
        st = load_hooks(probe, [job.pid])
        assert st.reason.startswith(LOADED) and "sys.remote_exec (Python 3.14)" in st.reason
    finally:
        probe.close()
        job.kill()
        job.wait()


FAILING_STEPS = """
import ctypes, sys, torch
sys.path.append({inject!r})
import gpudiag_attach, gpudiag_hooks, gpudiag_serve, gpudiag_channel, json, socket
import torch.optim.optimizer as optim
from torch.utils.data import DataLoader, dataloader
orig_next = dataloader._BaseDataLoaderIter.__next__
steps = [
    (gpudiag_hooks, "install_on_torch_import"), (gpudiag_hooks, "_State"),
    (gpudiag_hooks, "_Channel"), (gpudiag_serve, "install_requests"),
    (optim, "register_optimizer_step_post_hook"), (gpudiag_serve, "install_forwards"),
    (gpudiag_hooks, "_install_dist"), (gpudiag_hooks, "_install_capture"),
    (gpudiag_hooks, "_install_trim"), (gpudiag_hooks, "_guarded"),
    (gpudiag_attach, "_loaded"), (gpudiag_attach, "_hello"), (gpudiag_channel, "private_path"),
    (socket, "socket"), (json, "dumps"),
]
def boom(*a, **k):
    raise RuntimeError("planted")
script = {script!r}
m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
for mod, name in steps:
    gpudiag_hooks._state = None
    dataloader._BaseDataLoaderIter.__next__ = orig_next
    saved = getattr(mod, name)
    setattr(mod, name, boom)
    try:
        rc = ctypes.pythonapi.PyRun_SimpleString(script.encode())
    finally:
        setattr(mod, name, saved)
    assert rc == 0, (name, rc)
    for x in DataLoader(torch.randn(8, 4), batch_size=4):
        o.zero_grad(); m(x).sum().backward(); o.step()
    print("survived", name, flush=True)
rc = ctypes.pythonapi.PyRun_SimpleString({missing!r}.encode())
print("missing folder", rc, flush=True)
"""


def test_an_exception_in_any_install_step_never_reaches_the_job(tmp_path):
    pytest.importorskip("torch")
    sock = str(tmp_path / "agent.sock")
    code = FAILING_STEPS.format(
        inject=INJECT_DIR,
        script=script_text(INJECT_DIR, sock, "n"),
        missing=script_text(str(tmp_path / "absent"), sock, "n").replace("gpudiag_attach", "x_"),
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("survived") == 15 and "missing folder 0" in res.stdout
    assert "Traceback" not in res.stderr


def _attached(
    tmp_path: Path, seconds: int = 12, *extra: str, python: str = sys.executable
) -> tuple[dict, list[float]]:
    """attach --hooks on the starved-loader job: the report and the job's own step times."""
    times = tmp_path / "steps.json"  # the job stops once the look is over; seconds + 60 at most
    job = subprocess.Popen(
        [python, str(WORKLOADS / "attach_target.py"), str(seconds + 60), str(times)],
        stdout=subprocess.DEVNULL,
        cwd=WORKLOADS,
    )
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{times}.ready").exists() and time.monotonic() < deadline:
            time.sleep(0.2)  # attach to a job that is training, past its imports
        time.sleep(2.0)  # past its first steps' warm-up: the rate the look and the job compare
        out = tmp_path / "r.json"
        args = ("attach", str(job.pid), "--hooks", "-q", "--duration", str(seconds), *extra)
        res = gpudiag(*args, "--out", str(out), timeout=180)
        assert res.returncode == 0, res.stderr
        Path(f"{times}.stop").touch()  # the job ends at its next step and writes its times
        assert job.wait(timeout=120) == 0
        return json.loads(out.read_text()), json.loads(times.read_text())
    finally:
        job.kill()
        job.wait()


def _hook_step_span(recording: Path) -> tuple[float, float]:
    """The Unix times of the first and the last step the hooks saw, from a samples recording."""
    seen = []
    with gzip.open(recording, "rt") as f:
        for line in f:
            r = json.loads(line)
            values = r.get("values") or {}
            if r.get("probe") == "hooks" and ("step_time_s" in values or "first_step" in values):
                seen.append(r["t_ns"] / 1e9)
    return seen[0], seen[-1]


@needs_injector
@pytest.mark.parametrize("minor", [10, 11, 12, 13])
@pytest.mark.long
def test_attach_hooks_gets_the_jobs_own_steps_per_second(tmp_path, minor):
    """On each Python the job runs (3.10-3.13 through pyinjector, or gdb without it); another
    version than the suite's needs its interpreter with torch in GPUDIAG_TEST_PYTHONS. The
    job's own rate is taken over the steps the hooks timed (the report's start and end are
    whole seconds, and the job's rate drifts a few per cent over a look beside py-spy)."""
    python = _torch_python(minor)
    if python is None:
        pytest.skip(f"no Python 3.{minor} with torch (set GPUDIAG_TEST_PYTHONS to one)")
    rec = tmp_path / "rec.jsonl.gz"
    doc, times = _attached(
        tmp_path, 12, "--record", str(rec), "--record-layout", "samples", python=python
    )
    hooks = next(p for p in doc["probes"] if p["name"] == "hooks")
    assert hooks["reason"].startswith(LOADED), hooks
    first, last = _hook_step_span(rec)
    seen = [t for t in times if first - 0.02 <= t <= last + 0.02]  # the same steps, own clock
    assert len(seen) == doc["metrics"]["steps"]
    own = (len(seen) - 1) / (seen[-1] - seen[0])
    assert doc["metrics"]["steps_per_second"] == pytest.approx(own, rel=0.005)
    top = first_job_finding(doc, loader_finding(doc))
    assert top["evidence"][0]["source"] == "in-process hooks"


@pytest.mark.slow
@needs_injector
@pytest.mark.parametrize("minor", [10, 11, 12, 13])
def test_attach_hooks_data_wait_is_runs_within_five_points(tmp_path, minor):
    python = _torch_python(minor)
    if python is None:
        pytest.skip(f"no Python 3.{minor} with torch (set GPUDIAG_TEST_PYTHONS to one)")
    doc, _ = _attached(tmp_path, python=python)
    out = tmp_path / "run.json"
    job = [python, str(WORKLOADS / "attach_target.py"), "17", str(tmp_path / "t.json")]
    res = gpudiag("run", "-q", "--out", str(out), "--", *job, timeout=180, cwd=WORKLOADS)
    assert res.returncode == 0, res.stderr
    run_wait = json.loads(out.read_text())["metrics"]["data_wait_ratio"]
    assert abs(doc["metrics"]["data_wait_ratio"] - run_wait) <= 0.05, (doc["metrics"], run_wait)


QUIET_JOB = """
import os, sys, time, torch
sys.path.append({inject!r})
import gpudiag_hooks
gpudiag_hooks.QUIET_AFTER_S = 0.5
from torch.utils.data import DataLoader, dataloader
from torch.nn.modules import module as nn
from torch.optim.optimizer import _global_optimizer_post_hooks as steps
orig = dataloader._BaseDataLoaderIter.__next__
m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
def state(word):
    st = gpudiag_hooks._state
    ours = dataloader._BaseDataLoaderIter.__next__ is not orig
    forward = len(nn._global_forward_hooks) + len(nn._global_forward_pre_hooks)
    print(word, st is not None and st.quiet, ours, forward, len(steps), flush=True)
print("ready", flush=True)
said = set()
t = time.time()
while time.time() - t < 90:
    for x in DataLoader(torch.randn(64, 4), batch_size=4):
        if {train}:
            o.zero_grad(); m(x).sum().backward(); o.step()
        else:
            with torch.no_grad():
                m(x)
    time.sleep(0.005)
    for word in ("loaded", "gone", "woken", "stop"):
        if os.path.exists(os.path.join({folder!r}, word)) and word not in said:
            said.add(word); state(word)
    if "stop" in said:
        break
"""


@needs_injector
@pytest.mark.parametrize(
    "train", [pytest.param(True, marks=pytest.mark.long), False], ids=["training", "inference"]
)
def test_hooks_go_quiet_when_gpudiag_is_gone_and_wake_on_the_next_attach(tmp_path, train):
    """Quiet: the DataLoader class put back, the global forward hooks (an inference job's: a
    training job's went at its first step) and step hook out; a wake puts them back."""
    pytest.importorskip("torch")
    code = QUIET_JOB.format(inject=INJECT_DIR, folder=str(tmp_path), train=train)
    job = _job(sys.executable, code)
    assert job.stdout is not None
    seen = []
    try:
        for word in ("loaded", "gone", "woken", "stop"):
            if word in ("loaded", "woken"):
                probe = _probe(tmp_path / f"agent-{word}")
                assert load_hooks(probe, [job.pid]).reason.startswith(LOADED)
                time.sleep(0.5)
            if word == "gone":
                probe.close()  # gpudiag went away: the job's sends fail from now on
                time.sleep(1.5)
            (tmp_path / word).touch()
            seen.append(job.stdout.readline().strip())
        probe.close()
        # the job's word, its hooks quiet, the DataLoader class patched, global forward hooks,
        # global step hooks
        n = 0 if train else 2
        assert seen == [f"loaded False True {n} 1", "gone True False 0 0"] + [
            f"woken False True {n} 1",
            f"stop False True {n} 1",
        ]
        out, err = job.communicate(timeout=60)
        assert job.returncode == 0 and "Traceback" not in err, err
    finally:
        job.kill()
        job.wait()


@pytest.mark.slow
@needs_injector
def test_attach_hooks_goes_into_every_local_rank_of_a_ddp_job(tmp_path):
    pytest.importorskip("torch")
    torchrun = str(Path(sys.executable).parent / "torchrun")
    job = subprocess.Popen(
        [torchrun, "--standalone", "--nproc-per-node", "2", "dist_ddp.py", "--seconds", "40"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=WORKLOADS,
        env={**os.environ, "GPUDIAG_TEST_PLANT": "loop"},
    )
    try:
        time.sleep(12)
        out = tmp_path / "r.json"
        args = ("attach", str(job.pid), "--hooks", "-q", "--duration", "12")
        res = gpudiag(*args, "--out", str(out), timeout=180)
        assert res.returncode == 0, res.stderr
        doc = json.loads(out.read_text())
        hooks = next(p for p in doc["probes"] if p["name"] == "hooks")
        assert hooks["reason"].startswith(LOADED)
        assert len(re.findall(BY.format(minor=sys.version_info[1]), hooks["reason"])) == 2
        assert "DDP's communication hook cannot be added" in hooks["reason"]
        assert doc["distributed"]["straggler"].get("straggler") == 1
        assert job.wait(timeout=120) == 0
    finally:
        job.kill()
        job.wait()


@pytest.mark.slow
@needs_injector
def test_attach_hooks_takes_a_profiler_capture_on_request(tmp_path):
    pytest.importorskip("torch")
    doc, _ = _attached(tmp_path, 12, "--capture-steps", "3")
    assert len(doc["capture"]["steps"]) == 3
