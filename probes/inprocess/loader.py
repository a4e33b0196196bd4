"""Loading the in-process hooks into a running job (`gpudiag attach --hooks`).

One tiny script (`script_text`) is queued on the job's main thread, which runs it at its next
safe point in the interpreter, as a signal handler runs:

- Python 3.10-3.13 with pyinjector installed (x86-64): the job's main thread, stopped at a
  safe place, loads a tiny library whose initialiser calls
  `Py_AddPendingCall(PyRun_SimpleString, script)` (see injector, pendingso, ptrace_helper).
- Python 3.10-3.13 without it: gdb in batch mode (`-nx`, no prompts, a timeout) maps one page
  in the job (mmap: no malloc lock to meet), writes the script there and calls
  `Py_AddPendingCall(PyRun_SimpleString, page)`, then detaches. The script never raises (a
  pending call that failed would raise SystemError in the job's code).
- Python 3.14+: `sys.remote_exec(pid, file)` (PEP 768) from an interpreter of the job's
  version (this one when it is, else the job's own).

Only a job of gpudiag's own user is loaded (its hooks send to no other user's gpudiag), and
its version is read from its files (pyversion), never by running its executable.

Both end the same way: the script calls gpudiag_attach.install(channel, nonce), whose
hello on the channel is the handshake (HookProbe.await_hello). Nothing here waits on the job
itself: the caller waits a bounded time for the hello and explains its absence.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from gpudiag.probes.files import MAX_CMDLINE_BYTES, MAX_ENVIRON_BYTES, read_head
from gpudiag.probes.inject.gpudiag_channel import write_request
from gpudiag.probes.inprocess import injector, pyversion
from gpudiag.probes.spawn import start_process

GDB_TIMEOUT_S = 60.0  # symbol loading on a busy 2-core box takes a few seconds
VERSION_TIMEOUT_S = 10.0
CAP_SYS_PTRACE = 19
FORK_SYSCALLS = {56, 57, 58, 435}  # clone, fork, vfork, clone3 on x86-64
PTRACE_HINT = (
    "run gpudiag as the job's user with ptrace allowed: Yama's "
    "/proc/sys/kernel/yama/ptrace_scope 0 (or 1 when run as root or with CAP_SYS_PTRACE; "
    "in a container, --cap-add SYS_PTRACE)"
)


@dataclass(frozen=True)
class Loaded:
    """How the script got queued in one process, or why it did not (`reason` and `hint`)."""

    pid: int
    how: str | None = None  # "gdb (Python 3.11)" or "sys.remote_exec (Python 3.14)"
    reason: str | None = None
    hint: str | None = None


def script_text(inject_dir: str, channel: str, nonce: str) -> str:
    """The script the job runs (ASCII): no name bound in its __main__, nothing raised."""
    folder = ascii(inject_dir)
    return (
        "try:\n"
        f" __import__('sys').path.append({folder}) if {folder} not in"
        " __import__('sys').path else None\n"
        f" __import__('gpudiag_attach').install({ascii(channel)}, {ascii(nonce)})\n"
        "except BaseException:\n"
        " pass\n"
    )


def python_version(pid: int) -> tuple[int, int] | None:
    """The job's Python major.minor, read from its files (never by running it), or None."""
    return pyversion.python_version(pid)


def other_user(pid: int) -> int | None:
    """The job's effective uid when it is not gpudiag's, else None (also when unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next(ln for ln in f if ln.startswith("Uid:"))
        uid = int(line.split()[2])
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return None if uid == os.geteuid() else uid


def forking(pid: int) -> bool:
    """Whether the job's main thread is inside fork/vfork/clone now (x86-64 numbers)."""
    if platform.machine() != "x86_64":
        return False
    try:
        with open(f"/proc/{pid}/syscall") as f:
            first = f.read(64).split()[:1]
        return bool(first) and first[0].isdigit() and int(first[0]) in FORK_SYSCALLS
    except (OSError, ValueError):
        return False


def ptrace_problem() -> str | None:
    """Why this process may not ptrace a process of its own user, or None."""
    try:
        scope = int(_ptrace_scope().strip() or 0)
    except (OSError, ValueError):
        return None  # no Yama: same-user ptrace is allowed
    if scope == 0:
        return None
    if scope == 3:
        return "Yama's ptrace_scope is 3: no process may be traced until reboot"
    if _has_cap_ptrace():
        return None
    if scope == 2:
        return "Yama's ptrace_scope is 2 and gpudiag lacks CAP_SYS_PTRACE"
    return "Yama's ptrace_scope is 1 (only a process's parent may trace it)"


def _ptrace_scope() -> str:
    """Yama's ptrace_scope (OSError without Yama)."""
    with open("/proc/sys/kernel/yama/ptrace_scope") as f:
        return f.read(16)


def _has_cap_ptrace() -> bool:
    try:
        with open("/proc/self/status") as f:
            caps = next(ln for ln in f if ln.startswith("CapEff:")).split()[1]
        return bool(int(caps, 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, StopIteration, ValueError, IndexError):
        return False


def remote_debug_disabled(pid: int) -> bool:
    """Whether the job turned off PEP 768's remote debugging (environment or -X option)."""
    try:
        env = read_head(f"/proc/{pid}/environ", MAX_ENVIRON_BYTES).split(b"\0")
        argv = read_head(f"/proc/{pid}/cmdline", MAX_CMDLINE_BYTES).split(b"\0")
    except OSError:
        return False
    if any(e.startswith(b"PYTHON_DISABLE_REMOTE_DEBUG=") and e.split(b"=", 1)[1] for e in env):
        return True
    return b"disable_remote_debug" in argv


def load(pid: int, script: str, script_path: str) -> Loaded:
    """Queue `script` on `pid`'s main thread (`script_path`: where 3.14's remote_exec reads it,
    a file in the channel's private folder); never raises."""
    try:
        return _load(pid, script, script_path)
    except Exception as exc:  # noqa: BLE001 (attach goes on with stacks whatever happens)
        return Loaded(pid, reason=f"loading failed: {type(exc).__name__}: {exc}")


def _load(pid: int, script: str, script_path: str) -> Loaded:
    if forking(pid):
        return Loaded(
            pid,
            reason="the job was in the middle of a fork (its child would inherit the queued "
            "script half way)",
            hint="attach with --hooks again in a moment",
        )
    problem = ptrace_problem()
    if problem is not None:
        return Loaded(pid, reason=f"no ptrace permission: {problem}", hint=PTRACE_HINT)
    uid = other_user(pid)
    if uid is not None:
        return Loaded(
            pid,
            reason=f"the job runs as uid {uid} and gpudiag as uid {os.geteuid()}: its hooks "
            "send only to a gpudiag of their own user",
            hint="run `gpudiag attach --hooks` as the job's user",
        )
    version = python_version(pid)
    if version is None:
        return Loaded(
            pid,
            reason="the job's Python version could not be read (its interpreter is not "
            "visible from here: another container or mount namespace?)",
            hint="run gpudiag inside the job's container",
        )
    if version < (3, 10):
        return Loaded(pid, reason="Python older than 3.10: --hooks needs 3.10+")
    if version >= (3, 14):
        return _remote_exec(pid, version, script, script_path)
    if injector.missing() is None:
        return _pyinjector(pid, version, script)
    return _gdb(pid, version, script)


def _pyinjector(pid: int, version: tuple[int, int], script: str) -> Loaded:
    """3.10-3.13: the main thread loads a library that queues the script (no gdb)."""
    done, said = injector.inject(pid, script)
    if done:
        return Loaded(pid, how=f"pyinjector (Python {version[0]}.{version[1]})")
    hint = PTRACE_HINT if "ptrace" in said or "ermission" in said else None
    return Loaded(pid, reason=f"pyinjector could not queue the call: {said}", hint=hint)


# gdb cannot put back the registers of a process it called a function in: the kernel
# refused its write of the CPU's extended state (seen with gdb 13.1 on a Xeon with AMX,
# kernel 6.18, root, ptrace allowed): nothing to fix in the job or its permissions
XSTATE_ERROR = "Couldn't write extended state"
XSTATE_HINT = (
    "this gdb cannot call a function in a process on this CPU and kernel (its AMX/AVX-512 "
    f"register state); {injector.INSTALL_HINT} loads the hooks without gdb; or a newer gdb "
    "(14+), Python 3.14+ (sys.remote_exec, no gdb), or start the job under `gpudiag run` "
    "(or call gpudiag.instrument() in it)"
)


def _remote_exec(pid: int, version: tuple[int, int], script: str, path: str) -> Loaded:
    """3.14+: sys.remote_exec run by the job's own interpreter (the versions must match)."""
    name = f"sys.remote_exec (Python {version[0]}.{version[1]})"
    if remote_debug_disabled(pid):
        return Loaded(
            pid,
            reason="the job disabled remote debugging (PYTHON_DISABLE_REMOTE_DEBUG or "
            "-X disable_remote_debug)",
            hint="restart it without that setting, or under `gpudiag run`",
        )
    if not write_request(path, script):  # the channel's private writer (0600, no links)
        return Loaded(pid, reason=f"cannot write the script for sys.remote_exec at {path}")
    call = f"import sys; sys.remote_exec({pid}, {path!r})"
    # the job's own interpreter only where this one is another version: the job is of
    # gpudiag's own user (checked before), so its code runs with no more rights than it has
    python = sys.executable if sys.version_info[:2] == version else f"/proc/{pid}/exe"
    res = _bounded([python, "-I", "-S", "-c", call], GDB_TIMEOUT_S)
    if isinstance(res, str):
        return Loaded(pid, reason=f"sys.remote_exec {res}")
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["failed"])[-1][:300]
        return Loaded(pid, reason=f"sys.remote_exec refused: {last}", hint=PTRACE_HINT)
    return Loaded(pid, how=name)


def gdb_command(pid: int, script: str) -> list[str]:
    """gdb's batch command line: map a page, write the script there, queue the call."""
    data = script.encode()
    if len(data) >= 4096:
        raise ValueError("the script must fit in one page")
    return [
        *("gdb", "-p", str(pid), "-batch", "-nx", "-nw", "-q"),
        *("-iex", "set auto-solib-add off", "-iex", "set auto-load off"),
        *("-ex", "set confirm off", "-ex", "set pagination off"),
        *("-ex", "sharedlibrary libpython", "-ex", r"sharedlibrary libc\."),
        *("-ex", "set $gd = (char *) mmap((void *) 0, (unsigned long) 4096, 3, 34, -1, (long) 0)"),
        *("-ex", f"set {{char[{len(data) + 1}]}} $gd = {_c_string(script)}"),
        *("-ex", "print (int) Py_AddPendingCall((void *) PyRun_SimpleString, $gd)"),
        *("-ex", "detach"),
    ]


def _c_string(text: str) -> str:
    """`text` as a C string literal gdb reads back byte for byte."""
    out = []
    for b in text.encode():
        ch = chr(b)
        if ch in '\\"':
            out.append("\\" + ch)
        elif 32 <= b < 127:
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def _gdb(pid: int, version: tuple[int, int], script: str) -> Loaded:
    """3.10-3.13: gdb queues the script as a pending call; its printed result says whether."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return Loaded(
            pid,
            reason=f"neither pyinjector nor gdb can load them ({injector.missing()}, gdb is "
            f"not installed): one of them is needed on Python {version[0]}.{version[1]}",
            hint=f"{injector.INSTALL_HINT}, or install gdb (Debian/Ubuntu: apt-get install "
            "gdb), or use Python 3.14+",
        )
    cannot = gdb_cannot_call(gdb)
    if cannot is not None:  # found on a throwaway process: the job is never touched
        return Loaded(
            pid,
            reason=f"neither pyinjector nor gdb can load them ({injector.missing()}; gdb "
            f"cannot call a function in a process here: {cannot})",
            hint=XSTATE_HINT if cannot.startswith(XSTATE_ERROR) else PTRACE_HINT,
        )
    res = _bounded([gdb, *gdb_command(pid, script)[1:]], GDB_TIMEOUT_S)
    if isinstance(res, str):
        return Loaded(pid, reason=f"gdb {res}")
    result = re.search(r"^\$\d+ = (-?\d+)\s*$", res.stdout, re.M)
    if result is not None and result.group(1) == "0":
        return Loaded(pid, how=f"gdb (Python {version[0]}.{version[1]})")
    said = _gdb_error(res)
    hint = XSTATE_HINT if said.startswith(XSTATE_ERROR) else PTRACE_HINT
    return Loaded(pid, reason=f"gdb could not queue the call: {said}", hint=hint)


@functools.cache
def gdb_cannot_call(gdb: str) -> str | None:
    """Why gdb cannot call a function in a process on this machine, tried on a sleeping
    Python of our own (None: it can). Where the kernel refuses gdb's write of the CPU's
    extended state, a call made in the job would leave its registers wrong (a sleep there
    raised OSError 514): the job is not touched then."""
    child = start_process(
        [sys.executable, "-I", "-S", "-c", "import time; time.sleep(60)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.2)
        argv = [gdb, "-p", str(child.pid), "-batch", "-nx", "-nw", "-q"]
        res = _bounded([*argv, "-ex", "print (int) getpid()"], GDB_TIMEOUT_S)
    finally:
        child.kill()
        child.wait()
    if isinstance(res, str):
        return f"gdb {res}"
    if re.search(rf"^\$1 = {child.pid}\s*$", res.stdout, re.M):
        return None
    return _gdb_error(res)


def _gdb_error(res: subprocess.CompletedProcess) -> str:
    """gdb's most telling line (ptrace refused, a symbol missing)."""
    lines = [ln.strip() for ln in (res.stderr + res.stdout).splitlines() if ln.strip()]
    # a source file gdb has not ('71\t../sysdeps/...: No such file') says nothing
    lines = [ln for ln in lines if not re.match(r"^\d+\s", ln)]
    for ln in lines:
        if ln.startswith(XSTATE_ERROR):
            return ln[:300]
    for ln in lines:
        if "ptrace" in ln or "not permitted" in ln or "No symbol" in ln or "No such" in ln:
            return ln[:300]
    return (lines[-1] if lines else f"exit {res.returncode}")[:300]


def _bounded(argv: list[str], timeout: float) -> subprocess.CompletedProcess | str:
    """Run `argv` with no input and a time limit; past it, SIGTERM (gdb then detaches
    cleanly), then SIGKILL. A string says what went wrong."""
    try:
        proc = start_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        return f"could not start: {exc}"
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return f"did not finish in {timeout:.0f} s (stopped)"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
