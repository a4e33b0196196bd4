"""A job's Python version is read from the process, never by running its executable
(review adversarial-6, V01: root ran another user's private python3.11, whose own
`encodings` package beside it wrote a root-owned file)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag.probes.inprocess import loader
from gpudiag.probes.inprocess.pyversion import exe_version, python_version

STATIC_PY = Path("/usr/bin/python3.11")  # Debian's: libpython linked in, none in the maps


def exported_version(path: str) -> tuple[int, int] | None:
    """The version an executable file says it was built as (None: not a CPython)."""
    try:
        with open(path, "rb") as f:
            return exe_version(f)
    except OSError:
        return None


def test_the_version_of_this_process_is_read():
    assert python_version(os.getpid()) == sys.version_info[:2]
    assert exported_version(sys.executable) in (None, sys.version_info[:2])
    assert exported_version("/bin/sh") is None
    assert exported_version("/dev/zero") is None
    assert python_version(2**22 + 7) is None  # no such process


def _evil_python(home: Path, marker: Path) -> Path:
    """A copy of the system python whose stdlib landmark is beside it, with an `encodings`
    package that writes `marker` when it is run with -I (as gpudiag's version probe ran it)."""
    lib = home / "lib" / "python3.11"
    (lib / "encodings").mkdir(parents=True)
    (home / "bin").mkdir()
    exe = home / "bin" / "python3.11"
    exe.write_bytes(STATIC_PY.read_bytes())
    exe.chmod(0o755)
    real = Path("/usr/lib/python3.11")
    for f in real.iterdir():
        if f.name != "encodings":
            (lib / f.name).symlink_to(f)
    for f in (real / "encodings").iterdir():
        if f.name != "__init__.py":
            (lib / "encodings" / f.name).symlink_to(f)
    real_init = real / "encodings" / "__init__.py"
    (lib / "encodings" / "__init__.py").write_text(
        "import posix as _p\n"
        "def _read(path):\n"
        "    fd, out = _p.open(path, _p.O_RDONLY), b''\n"
        "    while (b := _p.read(fd, 65536)):\n"
        "        out += b\n"
        "    _p.close(fd)\n"
        "    return out\n"
        "if b'\\0-I\\0' in _read('/proc/self/cmdline'):\n"
        f"    _p.close(_p.open({str(marker)!r}, _p.O_WRONLY | _p.O_CREAT, 0o644))\n"
        f"exec(compile(_read({str(real_init)!r}), __file__, 'exec'))\n"
    )
    return exe


@pytest.mark.skipif(not STATIC_PY.exists(), reason="needs Debian's /usr/bin/python3.11")
def test_a_private_python_is_never_run_to_learn_its_version(tmp_path):
    marker = tmp_path / "RAN"
    exe = _evil_python(tmp_path / "evil", marker)
    job = subprocess.Popen([str(exe), "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while b"python3.11" not in Path(f"/proc/{job.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)  # past its start-up
        assert b"libpython" not in Path(f"/proc/{job.pid}/maps").read_bytes()
        assert loader.python_version(job.pid) == (3, 11)
    finally:
        job.kill()
        job.wait()
    assert not marker.exists(), "the job's own interpreter was run"
