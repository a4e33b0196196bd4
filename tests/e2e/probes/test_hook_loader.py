"""End to end: attach --hooks, without a job: the script the job runs, gdb's command line, the
checks before injecting, the handshake on the channel and the words of the report."""

from __future__ import annotations

from gpudiag.probes.inprocess import loader
from tests.probes.test_hook_loader import _gdb_said, _no_pyinjector


def test_a_gdb_that_cannot_call_here_leaves_the_job_untouched_and_says_why(monkeypatch):
    """On a Xeon with AMX (kernel 6.18, gdb 13.1) gdb's call could not write the CPU's
    extended state back and a sleep in the job raised OSError 514: gdb is tried on a
    throwaway process first, and the job is never attached when it fails there."""
    _no_pyinjector(monkeypatch)
    monkeypatch.setattr(loader, "ptrace_problem", lambda: None)
    monkeypatch.setattr(loader, "python_version", lambda pid: (3, 11))
    monkeypatch.setattr(loader.shutil, "which", lambda name: "/usr/bin/gdb")
    loader.gdb_cannot_call.cache_clear()
    ran: list[list[str]] = []

    def bounded(argv, timeout):
        ran.append(argv)
        return _gdb_said(
            "[Inferior 1 (process 9) detached]\n",
            "71\t../sysdeps/unix/sysv/linux/clock_nanosleep.c: No such file or directory.\n"
            "Couldn't write extended state status: Bad address.\nInvalid cast.\n",
        )

    monkeypatch.setattr(loader, "_bounded", bounded)
    try:
        got = loader.load(42, "pass\n", "/unused")
    finally:
        loader.gdb_cannot_call.cache_clear()
    assert got.how is None and len(ran) == 1 and "42" not in ran[0]
    assert "gdb cannot call a function in a process here: Couldn't write" in got.reason
    assert "pyinjector is not installed" in got.reason
    assert "newer gdb" in got.hint and "gpudiag run" in got.hint
    assert "pip install pyinjector" in got.hint
