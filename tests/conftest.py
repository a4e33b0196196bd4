"""Shared fixtures: paths to the workloads and a helper to run the gpudiag CLI."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKLOADS = Path(__file__).parent / "workloads"


def gpudiag(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the installed CLI as a user would, capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "gpudiag.agent.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def run_embed_hf(tmp: Path, seconds: float, *flags: str) -> dict:
    """`gpudiag run -q --duration 8` on the planted embedding job (tests/workloads/embed_hf.py,
    `seconds` long, with `flags`): its report."""
    out = tmp / "r.json"
    job = [sys.executable, str(WORKLOADS / "embed_hf.py"), "--seconds", str(seconds), *flags]
    res = gpudiag("run", "-q", "--duration", "8", "--out", str(out), "--", *job)
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


def gpudiag_until_sure(*args: str, tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """`gpudiag run|attach --until-sure ...`: its output through files, not pipes (a `run`
    job left running keeps its copy of gpudiag's stdout open), and a `run` job left running
    killed."""
    out, err = tmp / "gpudiag.stdout", tmp / "gpudiag.stderr"
    with open(out, "w") as fo, open(err, "w") as fe:
        res = subprocess.run(
            [sys.executable, "-m", "gpudiag.agent.cli.main", *args],
            stdout=fo,
            stderr=fe,
            timeout=timeout,
        )
    res.stdout, res.stderr = out.read_text(), err.read_text()
    kill_left_job(res.stderr)
    return res


def start_training(
    args: list[str], ready: Path, env: dict | None = None, settle_s: float = 1.0
) -> subprocess.Popen:
    """Start a workload (tests/workloads/*.py, whose train() creates GPUDIAG_TEST_READY after
    its first step) and return once it has trained for `settle_s`: past its imports and its
    loop's first step, for an attach. Waiting for the step, not a fixed sleep, is shorter on
    an idle box and enough on a busy one (a torch import took 7.6 s at load 5)."""
    job = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**(env or os.environ), "GPUDIAG_TEST_READY": str(ready)},
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            job.wait()
            raise AssertionError(f"{args[0]}: no first step (exit status {job.returncode})")
        time.sleep(0.1)
    time.sleep(settle_s)
    return job


def kill_left_job(stderr: str) -> None:
    """`run --until-sure` stops profiling before the job ends and leaves the job running (as
    `--duration` does): a test kills it."""
    left = re.search(r"the job \(pid (\d+)\) keeps running", stderr)
    if left:
        try:
            os.kill(int(left.group(1)), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def run_cli():
    return gpudiag


@pytest.fixture
def cli(capsys, monkeypatch):
    """`gpudiag ARGS...` called in this process, as `main([...])`: its exit code and what it
    printed, as `gpudiag()` gives them. For parsing, usage errors and --help; a test that
    launches or attaches to a job, or sends a signal, runs the real process (`gpudiag()`)."""
    from gpudiag.agent.cli.main import main

    monkeypatch.delenv("GPUDIAG_DEBUG", raising=False)  # an internal error: one line, as run
    monkeypatch.setenv("COLUMNS", "80")  # --help wrapped as under a pipe, not this terminal

    def call(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's --help and --version
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["gpudiag", *args], code, out, err)

    return call


BURN = "while True:\n    sum(range(10000))\n"


@pytest.fixture
def busy_core():
    """A process burning one core for the whole test (a loaded box), always killed after.
    Yields its pid."""
    proc = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@functools.cache
def hooks_cannot_load() -> str | None:
    """Why `attach --hooks` cannot load the hooks into a Python 3.10-3.13 job here (None: it
    can): pyinjector installed (the `test` extra has it), else gdb able to call a function."""
    from gpudiag.probes.inprocess import injector

    why = injector.missing()
    if why is None:
        return None
    gdb = gdb_cannot_call()
    return None if gdb is None else f"{why}, and {gdb}"


@functools.cache
def gdb_cannot_call() -> str | None:
    """Why gdb cannot call a function in a process here (`attach --hooks` on Python
    3.10-3.13 needs it), or None when it can: it is installed and a call in a sleeping
    Python comes back (on a Xeon with AMX, kernel 6.18, Debian's gdb 13.1 could not write
    the CPU's extended state back: "Couldn't write extended state status")."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "gdb is not installed (.ci/run installs it where it is root with apt-get)"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        res = subprocess.run(
            [gdb, "-p", str(child.pid), "-batch", "-nx", "-q", "-ex", "print (int) getpid()"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return "gdb took over 60 s to call getpid() in a sleeping Python"
    finally:
        child.kill()
        child.wait()
    if re.search(rf"^\$1 = {child.pid}$", res.stdout, re.M):
        return None
    said = [ln for ln in (res.stderr + res.stdout).splitlines() if "extended state" in ln]
    return "gdb cannot call a function in a process on this machine: " + (
        said[0] if said else (res.stderr.strip().splitlines() or ["no answer"])[-1]
    )


def _nvml_has_gpu() -> bool:
    import os

    from gpudiag.probes.base import Target
    from gpudiag.probes.gpu.probe import GpuProbe

    probe = GpuProbe()
    ok = probe.open(Target(os.getpid())).available
    probe.close()
    return ok


# The e2e tier: a test that starts a process (gpudiag's command line, a job, a shell tool) or
# drives a Textual app, in its own body, through a helper of its module or through a fixture.
# `pytest -m "not e2e and not slow"` is the fast tier (CONTRIBUTING.md).
_STARTS = re.compile(
    r"\bgpudiag(?:_until_sure)?\(|\bsubprocess\.|\bPopen\(|\bos\.(?:fork|spawn|exec)|"
    r"\bWORKLOADS\b|\brun_test\(|\bsnap_compare\b|\bmultiprocessing\b"
)
E2E_FIXTURES = {
    "run_cli",
    "busy_core",
    "snap_compare",
    "attached_instrumented",
    "bounded_cli_runs",
    "quiet_server_run",
}


def _starting_helpers(module) -> set[str]:
    """The module's own functions that start a process, directly or through one another."""
    sources = {}
    for name, fn in vars(module).items():
        if inspect.isfunction(fn) and fn.__module__ == module.__name__:
            try:
                sources[name] = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
    found = {n for n, src in sources.items() if _STARTS.search(src)}
    while found:
        more = {n for n, src in sources.items() if n not in found and _calls(found, src)}
        if not more:
            break
        found |= more
    return found


def _calls(names: set[str], src: str) -> bool:
    pattern = "|".join(re.escape(n) for n in names)
    return bool(names) and re.search(rf"\b(?:{pattern})\(", src) is not None


def _starts_a_process(item, helpers: set[str]) -> bool:
    if E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    fn = getattr(item, "function", None)
    try:
        src = inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):
        return False
    if _STARTS.search(src):
        return True
    return _calls(helpers - {fn.__name__}, src)


def pytest_collection_modifyitems(config, items):
    """Tests that start a process are marked `e2e`, the others that are not `slow` `fast`
    (`-m fast` is `-m "not e2e and not slow"`); tests marked `gpu` run only where NVML finds
    a GPU."""
    helpers: dict[str, set[str]] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if module.__name__ not in helpers:
            helpers[module.__name__] = _starting_helpers(module)
        if _starts_a_process(item, helpers[module.__name__]):
            item.add_marker(pytest.mark.e2e)
        elif "slow" not in item.keywords:
            item.add_marker(pytest.mark.fast)
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if gpu_items and not _nvml_has_gpu():
        skip = pytest.mark.skip(reason="no NVIDIA GPU found by NVML")
        for item in gpu_items:
            item.add_marker(skip)
