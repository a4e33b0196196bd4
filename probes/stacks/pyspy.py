"""Running py-spy: finding it, explaining its errors, one recorder of a window and its
cost, and the target-process checks the stack probe retries on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpudiag.probes.files import read_head

# never `setcap cap_sys_ptrace+ep` on py-spy: that lets every local user read every process,
# root's included
PTRACE_HINT = (
    "run gpudiag as the job's user or as root (sudo), or allow ptrace of your own processes: "
    "`echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope`; "
    "in Docker add `--cap-add SYS_PTRACE`"
)


def find_py_spy() -> str | None:
    """Locate the py-spy executable: next to this Python first (a venv), then on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


def diagnose_py_spy_error(text: str, pid: int) -> tuple[str, str | None]:
    """Turn py-spy's error output into (reason, hint) a user can act on."""
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return (f"no permission to read the memory of pid {pid} (ptrace)", PTRACE_HINT)
    if "failed to find python version" in low or "failed to get process executable" in low:
        return (
            f"pid {pid} is not a Python process (py-spy found no interpreter)",
            "attach to the Python process of the job (the one running the training loop)",
        )
    if "no such process" in low or "failed to open process" in low:
        return (f"no process with pid {pid}", None)
    last = [ln for ln in text.strip().splitlines() if ln.strip()]
    return ((last[0] if last else "py-spy failed").strip()[:300], None)


CRASH_HINT = (
    "update py-spy (`pip install -U py-spy`) or try `--blocking`; if it persists, report "
    "py-spy's message above to https://github.com/benfred/py-spy/issues"
)


def crash_reason(text: str, run: SpyRun, pid: int) -> tuple[str, str | None]:
    """(reason, fix) for a py-spy recorder that produced nothing: denied, or crashed."""
    reason, hint = diagnose_py_spy_error(text, pid)
    code = run.proc.returncode if run.proc is not None else None
    if hint is None and code not in (None, 0, 1):
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return f"py-spy crashed ({how}): {reason}", CRASH_HINT
    return reason, hint or (CRASH_HINT if "panicked" in text else None)


@dataclass
class SpyRun:
    """One py-spy recorder of a window: what it samples and where its output goes."""

    mode: str  # "all" (loop process), "gil", or "worker"
    pid: int
    rate: int
    out: str
    proc: subprocess.Popen | None = None
    err: str = ""
    cpu_s: float = 0.0
    maxrss_bytes: int = 0


# py-spy's cost per sample of a process, from the development machine (2 cores, 2026-11):
# about 0.15 ms plus 0.06 ms per thread (it reads every thread's stack with --idle). Used only
# for a first guess of the rate; the agent's budget governor then measures the real cost.
SPY_SAMPLE_BASE_S = 0.15e-3
SPY_SAMPLE_PER_THREAD_S = 0.06e-3
SPY_START_S = 0.01  # CPU to start one py-spy recorder (reads the interpreter's symbols)


STATUS_BYTES = 16384  # /proc/PID/status: about 1.5 KB
MEMORY_POLL_S = 0.2  # how often a window's recorders' own peak memory is read


def own_peak_rss(pid: int, proc: str = "/proc") -> int:
    """A child's own peak resident memory since its exec (VmHWM), 0 when gone or unreadable.
    Not wait4's ru_maxrss: a child forked (or vforked) from the agent carries the agent's peak
    across its exec, so each py-spy read as the agent's whole size again (an agent of 242 MB
    with two recorders reported 761 MB; py-spy itself held about 10 MB)."""
    try:
        text = read_head(f"{proc}/{pid}/status", STATUS_BYTES).decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def watch_memory(runs: list[SpyRun], poll_s: float = MEMORY_POLL_S) -> None:
    """Until every recorder has exited (left unreaped for wait_recorder): each one's own peak
    resident memory, read every `poll_s`."""
    live = [r for r in runs if r.proc is not None]
    while live:
        for r in list(live):
            pid = r.proc.pid if r.proc is not None else 0
            r.maxrss_bytes = max(r.maxrss_bytes, own_peak_rss(pid))
            try:
                done = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            except ChildProcessError:  # already reaped
                done = True
            if done:
                live.remove(r)
        if live:
            time.sleep(poll_s)


def wait_recorder(run: SpyRun) -> None:
    """Wait for a recorder, keeping its stderr, exit code and CPU time (its own peak memory
    is watch_memory's)."""
    p = run.proc
    if p is None:
        return
    run.err = p.stderr.read() if p.stderr else ""
    if p.stderr:
        p.stderr.close()
    try:
        _, status, usage = os.wait4(p.pid, 0)
    except ChildProcessError:  # already reaped (close() polled it)
        p.wait()
        return
    p.returncode = os.waitstatus_to_exitcode(status)
    run.cpu_s = usage.ru_utime + usage.ru_stime


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def process_age_s(pid: int) -> float:
    try:
        return time.time() - psutil.Process(pid).create_time()
    except Exception:
        return 1e9
