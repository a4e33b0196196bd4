"""Shared fixtures: paths to the workloads and a helper to run the gpudiag CLI."""

from __future__ import annotations

import _posixsubprocess
import contextlib
import functools
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


def assert_one_line_error(res: subprocess.CompletedProcess, *words: str) -> None:
    """A usage error: exit status 2 and one line `gpudiag: error: ...` naming `words`."""
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("gpudiag: error: ")
    for w in words:
        assert w in lines[0]


def run_embed_hf(tmp: Path, seconds: float, *flags: str) -> dict:
    """`gpudiag run -q` on the planted embedding job (tests/workloads/embed_hf.py, its loop
    `seconds` long, with `flags`) until it ends: its report. The look has no fixed duration: a
    look that ends before the first forward sees no loop, and on a busy box (load 11 on 2
    cores) the job's start-up (torch and transformers imported, the model built) took longer
    than the 8 s a fixed `--duration 8` gave it."""
    out = tmp / "r.json"
    job = [sys.executable, str(WORKLOADS / "embed_hf.py"), "--seconds", str(seconds), *flags]
    res = gpudiag("run", "-q", "--out", str(out), "--", *job, timeout=240)
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


E2E = Path(__file__).parent / "e2e"


class _NoProcess:
    """While a test outside tests/e2e/ sets up, runs and tears down (its module's fixtures
    included): every way to start a process refuses, and is remembered (a test that swallows
    the refusal still fails)."""

    PATCHED = (
        (subprocess.Popen, "_execute_child"),
        (_posixsubprocess, "fork_exec"),
        (os, "fork"),
        (os, "forkpty"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
    )

    def __init__(self) -> None:
        self.started: list[str] = []

    def refuse(self, what: str):
        def refused(*args, **kwargs):
            self.started.append(what)
            raise AssertionError(self.why())

        return refused

    def why(self) -> str:
        return (
            f"a test outside tests/e2e/ started a process ({', '.join(self.started)}): the fast "
            "tier starts none; move the test to tests/e2e/ (the same sub-folder), or test the "
            "logic in-process"
        )

    @contextlib.contextmanager
    def active(self):
        saved = [(o, n, getattr(o, n)) for o, n in self.PATCHED if hasattr(o, n)]
        for owner, name, _ in saved:
            setattr(owner, name, self.refuse(f"{getattr(owner, '__name__', owner)}.{name}"))
        try:
            yield
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
        if self.started:
            raise AssertionError(self.why())


def _in_e2e(item) -> bool:
    return E2E in Path(str(item.path)).parents


@contextlib.contextmanager
def _tier_held(item):
    if _in_e2e(item):
        yield
        return
    with _NoProcess().active():
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """The tier is the folder, and this holds it: a test outside tests/e2e/ that starts a
    process (subprocess, fork, posix_spawn, multiprocessing), in its body or its fixtures,
    fails saying where it belongs."""
    with _tier_held(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _tier_held(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _tier_held(item):
        return (yield)


def pytest_collection_modifyitems(config, items):
    """Tiers by folder: the tests under tests/e2e/ (they start a process: gpudiag's command
    line, a job, a tool; or drive the terminal UI) are marked `e2e`, the others that are not
    `slow` `fast` (`-m fast` is `-m "not e2e and not slow"`); tests marked `gpu` run only
    where NVML finds a GPU."""
    for item in items:
        if _in_e2e(item):
            item.add_marker(pytest.mark.e2e)
        elif "slow" not in item.keywords:
            item.add_marker(pytest.mark.fast)
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if gpu_items and not _nvml_has_gpu():
        skip = pytest.mark.skip(reason="no NVIDIA GPU found by NVML")
        for item in gpu_items:
            item.add_marker(skip)
