"""End to end: in-process hooks: exact step counts, agreement with stacks, and never hurting the
job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.inprocess.channel import INJECT_DIR, HookProbe, injection_env
from tests.conftest import WORKLOADS, gpudiag, start_training
from tests.e2e.agent.test_e2e_workloads import loader_finding
from tests.job_findings import first_job_finding, load_per_core

pytest.importorskip("torch")


def job_steps(output: str) -> tuple[int, float]:
    m = re.search(r"steps: (\d+) in ([\d.]+) s", output)
    assert m, output
    return int(m.group(1)), float(m.group(2))


# the hooks time every step the same way whatever the loop waits on: the starved loader
# (steps that wait for batches) is the default suite's case; the healthy job is -m slow
@pytest.mark.parametrize(
    "name", [pytest.param("healthy", marks=pytest.mark.slow), "starved_loader"]
)
@pytest.mark.long
def test_report_step_count_equals_the_jobs_own(name, tmp_path):
    out = tmp_path / "r.json"
    res = gpudiag(
        "run",
        "-q",
        "--out",
        str(out),
        "--",
        sys.executable,
        str(WORKLOADS / f"{name}.py"),
        "--seconds",
        "8",
    )
    assert res.returncode == 0, res.stderr
    steps, secs = job_steps(res.stdout)
    m = json.loads(out.read_text())["metrics"]
    assert m["steps"] == steps
    assert m["steps_per_second"] == pytest.approx(steps / secs, rel=0.02)
    assert m["samples_per_second"] == pytest.approx(
        m["steps_per_second"] * 64 if name == "healthy" else m["steps_per_second"] * 32, rel=0.02
    )
    assert 0 < m["step_time_p50_s"] <= m["step_time_p95_s"] <= m["step_time_max_s"]


@pytest.fixture(scope="module")
def attached_instrumented(tmp_path_factory) -> dict:
    """One `attach --capture-steps 4` of 15 s to a job that calls instrument() (the starved
    loader): its report, read by the tests below for what each checks."""
    folder = tmp_path_factory.mktemp("attached")
    out = folder / "r.json"
    env = dict(os.environ, PYTHONPATH=str(WORKLOADS))
    # attached once it is training (its first step taken, past the imports)
    # its loader's workers past their warm-up: the exact and the sampled data wait of the
    # look compared below are then the same steady loop's (1 s after the first step, a clean
    # clone at load 3-4 read them 0.064 apart)
    job = start_training(
        [str(WORKLOADS / "instrumented.py"), "--seconds", "60"], folder / "ready", env, 4.0
    )
    try:
        args = ("attach", str(job.pid), "-q", "--duration", "15", "--capture-steps", "4")
        res = gpudiag(*args, "--out", str(out), timeout=120)
        assert res.returncode == 0, res.stderr
        return json.loads(out.read_text())
    finally:
        job.kill()
        job.wait()


@pytest.mark.long
def test_attach_to_an_instrumented_job_gets_exact_timing_matching_the_stacks(
    attached_instrumented,
):
    doc = attached_instrumented
    exact = doc["metrics"]["data_wait_ratio"]
    sampled = doc["breakdown"]["shares"]["data_wait"] + doc["breakdown"]["shares"]["storage_io"]
    # the stacks sample one window in three seconds: 0.064 and 0.065 apart in two runs of the
    # full suite (loads 3-4 and 1-2), 0.00-0.03 in most, 0.087 at load 5-6 (2 cores); 0.08
    # (0.10 on a busy box) still fails a wrong split
    allowed = 0.10 if load_per_core() > 2.0 else 0.08
    assert exact > 0.3 and abs(exact - sampled) <= allowed, (exact, sampled, load_per_core())
    top = first_job_finding(doc, loader_finding(doc))
    assert top["evidence"][0]["source"] == "in-process hooks"


@pytest.mark.long
def test_attach_capture_steps_on_an_instrumented_job(attached_instrumented):
    """attach --capture-steps N: asked through the request file once the job's hooks connect
    (run --capture-steps is tests/agent/test_capture_run.py)."""
    doc = attached_instrumented
    assert len(doc["capture"]["steps"]) == 4
    assert doc["capture"]["top_ops"]


def test_dead_or_absent_agent_leaves_the_job_unchanged(tmp_path):
    code = (
        "import sys, torch\n"
        "m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(300):\n"
        "    o.zero_grad(); m(torch.randn(8, 4)).sum().backward(); o.step()\n"
        "print('done'); sys.exit(3)\n"
    )
    probe = HookProbe()
    probe.open(Target(0))
    env = injection_env(dict(os.environ), probe.path)
    probe.close()  # the agent is gone before the job even starts
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 3 and res.stdout.strip() == "done"
    assert "Traceback" not in res.stderr


def test_killing_the_agent_mid_run_leaves_the_job_running_to_completion(tmp_path):
    marker, started = tmp_path / "finished", tmp_path / "started"
    code = (
        "import time, torch, pathlib\n"
        "m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        f"pathlib.Path({str(started)!r}).write_text('ok')\n"
        "t = time.time()\n"
        "while time.time() - t < 5:\n"
        "    o.zero_grad(); m(torch.randn(8, 4)).sum().backward(); o.step()\n"
        f"pathlib.Path({str(marker)!r}).write_text('ok')\n"
    )
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpudiag.agent.cli.main",
            "run",
            "-q",
            "--out",
            str(tmp_path / "r.json"),
            "--",
            sys.executable,
            "-c",
            code,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # mid-run: the job's hooks have been sending steps for a second
    assert not marker.exists()
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    for _ in range(60):
        if marker.exists():
            break
        time.sleep(0.5)
    assert marker.read_text() == "ok"


def test_an_existing_sitecustomize_still_runs(tmp_path):
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    env = injection_env(dict(os.environ, PYTHONPATH=str(own)), str(tmp_path / "none.sock"))
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [INJECT_DIR, str(own)]
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; "
            "print(os.environ.get('USER_SITE_RAN'), "
            "sys.modules['sitecustomize'].__file__)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    ran, ours = res.stdout.split()
    assert ran == "yes" and ours.startswith(INJECT_DIR)


def test_without_the_channel_the_sitecustomize_does_nothing():
    env = dict(os.environ, PYTHONPATH=INJECT_DIR)
    env.pop("GPUDIAG_CHANNEL", None)
    res = subprocess.run(
        [sys.executable, "-c", "import torch, sys; print('gpudiag_hooks' in sys.modules)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.stdout.strip() == "False"


ASKED_FIRST = """
import importlib.util, sys
assert importlib.util.find_spec("torch") is not None  # transformers' is_torch_available
try:
    importlib.util.find_spec("werkzeug.serving")  # a server module asked about, too
except ImportError:
    pass
import torch
import gpudiag_hooks
st = gpudiag_hooks._state
print("installed", st.torch is not None, len(st.serve.forward_handles))
try:
    import werkzeug.serving
    print("werkzeug", bool(werkzeug.serving.WSGIRequestHandler.__dict__.get("_gpudiag_patched")))
except ImportError:
    print("werkzeug", True)
"""


def test_a_find_spec_that_only_asks_does_not_use_up_the_import_watchers(tmp_path):
    """`importlib.util.find_spec("torch")` before `import torch` (transformers' availability
    check, run when a script imports transformers first) used up the watcher that installs the
    hooks: a FastAPI app importing transformers before torch had no forward hooks. The same
    for the server modules' watcher."""
    env = injection_env(dict(os.environ), str(tmp_path / "none.sock"))
    out = subprocess.run(
        [sys.executable, "-c", ASKED_FIRST], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "installed True 2" in out.stdout, out.stdout + out.stderr
    assert "werkzeug True" in out.stdout, out.stdout + out.stderr
