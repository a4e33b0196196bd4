"""attach --hooks without gdb: the library written byte by byte that queues the script, the
job's version read from its files (never by running it), and the helper's refusals."""

from __future__ import annotations

import glob
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.probes.inprocess import injector, pendingso, pyversion

needs_x86 = pytest.mark.skipif(pendingso.supported() is not None, reason="x86-64 only")

LOAD_IN_A_CHILD = """
import ctypes, sys, builtins
ctypes.CDLL(sys.argv[1])
for _ in range(3):
    pass
print("after", getattr(builtins, "GPUDIAG_T", None), flush=True)
"""


@needs_x86
def test_the_library_queues_the_script_and_the_interpreter_runs_it(tmp_path):
    """dlopen runs its initialiser, which queues the script (Py_AddPendingCall); the
    interpreter runs it at its next check."""
    lib = tmp_path / "q.so"
    lib.write_bytes(pendingso.library("import builtins\nbuiltins.GPUDIAG_T = 'ran'\n"))
    res = subprocess.run(
        [sys.executable, "-c", LOAD_IN_A_CHILD, str(lib)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and res.stdout == "after ran\n", res.stderr


@needs_x86
def test_a_process_without_python_refuses_to_load_it_and_runs_nothing(tmp_path):
    """Both symbols are bound at load: where they are not exported, the loader says so."""
    lib = tmp_path / "q.so"
    lib.write_bytes(pendingso.library("pass\n"))
    res = subprocess.run(
        ["/bin/true"], env={"LD_PRELOAD": str(lib)}, capture_output=True, text=True, timeout=60
    )
    assert res.returncode != 0 and "undefined symbol: Py_" in res.stderr


@needs_x86
def test_an_interpreter_not_running_yet_or_any_more_is_left_alone(tmp_path):
    """Loaded before Py_Initialize (as into a job already past Py_Finalize, where it was seen
    reading through a null pointer: SIGSEGV caught by the injector, 5 times in ~640 loads
    into jobs that were exiting), the library queues nothing."""
    lib = tmp_path / "q.so"
    lib.write_bytes(pendingso.library("print('script ran')\n"))
    res = subprocess.run(
        [sys.executable, "-c", "print('job ok')"],
        env={**os.environ, "LD_PRELOAD": str(lib)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and res.stdout == "job ok\n", res.stderr


def test_the_script_must_be_short_ascii_without_nul():
    with pytest.raises(ValueError):
        pendingso.library("x" * (pendingso.MAX_SCRIPT + 1))
    with pytest.raises(ValueError):
        pendingso.library("print('é')")
    with pytest.raises(ValueError):
        pendingso.library("a\0b")


def _pythons() -> list[str]:
    found = sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.*/bin/python3.*[0-9]")))
    return [p for p in found + ["/usr/bin/python3.11"] if os.path.exists(p)]


@pytest.mark.parametrize("path", _pythons() or [sys.executable])
def test_the_version_is_read_from_the_interpreters_files(path):
    """Statically linked (Debian's python3.11 exports Py_Version) or needing libpython3.X."""
    real = os.path.realpath(path)
    want = tuple(int(x) for x in Path(real).name.removeprefix("python").split(".")[:2])
    with open(real, "rb") as f:
        got = pyversion.exe_version(f)
    assert got == want or (want < (3, 10) and got == pyversion.OLDER)


def test_a_running_jobs_version_is_read_without_running_anything():
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pyversion.python_version(job.pid) == sys.version_info[:2]
    finally:
        job.kill()
        job.wait()


@pytest.mark.parametrize(
    "data",
    [b"", b"\x7fELF", b"not an elf at all" * 100, Path("/bin/ls").read_bytes()[:300]],
)
def test_a_file_that_is_no_cpython_gives_no_version(data):
    assert pyversion.exe_version(io.BytesIO(data)) is None


def test_a_cut_or_scrambled_interpreter_never_raises():
    """The job's owner made the file: every cut of a real interpreter gives a version or None."""
    path = next((p for p in _pythons() if pyversion.exe_version(open(p, "rb"))), None)
    data = Path(path or "/bin/ls").read_bytes()
    for cut in (64, 4096, len(data) // 3, len(data) - 100):
        pyversion.exe_version(io.BytesIO(data[:cut]))
    for at in range(0, 64, 8):
        bad = bytearray(data)
        bad[40 + at : 48 + at] = b"\xff" * 8
        pyversion.exe_version(io.BytesIO(bytes(bad)))


def test_the_helper_answers_one_line_about_a_process_that_is_gone():
    if injector.missing() is not None:
        pytest.skip(f"attach --hooks without gdb: {injector.missing()}")
    job = subprocess.Popen([sys.executable, "-c", "pass"])
    job.wait()
    done, said = injector.inject(job.pid, "pass\n")
    assert not done and said and "Traceback" not in said


SUMMING_JOB = """
import os, sys, time, torch
torch.set_num_threads(1)
x = torch.rand(2**22, generator=torch.Generator().manual_seed(0))
ref, bad, n = float(x.sum()), 0, 0
print("ready", flush=True)
t = time.time()
while time.time() - t < 60 and not os.path.exists(sys.argv[1]):
    bad += float(x.sum()) != ref
    n += 1
print(bad, n, flush=True)
"""


def test_the_jobs_arithmetic_is_untouched_by_the_injection(tmp_path):
    """The main thread is stopped in the middle of torch's vectorised sum most of the time; the
    injected dlopen uses the same vector registers. Without the helper putting the extended
    state back, 19 of 20 injections changed the job's sum (measured); with it, none may."""
    pytest.importorskip("torch")
    if injector.missing() is not None:
        pytest.skip(f"attach --hooks without gdb: {injector.missing()}")
    job = subprocess.Popen(
        [sys.executable, "-c", SUMMING_JOB, str(tmp_path / "stop")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        done = [injector.inject(job.pid, "pass\n") for _ in range(12)]
        assert all(ok for ok, _ in done), done
        (tmp_path / "stop").touch()
        out, _ = job.communicate(timeout=90)
    finally:
        job.kill()
        job.wait()
    bad, n = (int(x) for x in out.split()[-2:]) if out.strip() else (None, 0)
    assert bad == 0 and n > 0, out
