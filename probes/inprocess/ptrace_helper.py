"""The one-shot helper that makes a job's main thread load gpudiag's pending-call library.

Run by the agent as `python -I ptrace_helper.py PID TRIES SITE` (SITE: the folder the agent
found pyinjector in) with the library's bytes on stdin
(gpudiag.probes.inprocess.pendingso writes them); prints one JSON line and exits. A separate
process so that a target that never comes back from dlopen cannot hang the agent: the agent
kills this helper after a time limit (the kernel then detaches it). Imports only the standard
library and pyinjector (a ptrace injector, kubo/injector wrapped: it stops the thread, calls
dlopen in it with a stack of its own, puts the general registers and its code bytes back).

Two things the injector does not do are done here, while it holds the thread stopped:
- **Only a safe place.** dlopen takes the loader's lock and calls malloc; a thread stopped
  inside malloc (its arena lock held), inside the dynamic loader, or in a memory system call
  malloc makes with that lock held would deadlock in it (so would one inside a preloaded
  jemalloc, tcmalloc or mimalloc). The stopped thread's registers are
  read first: inside libc's or the loader's code outside a system call, in brk/mmap/munmap/
  mremap/mprotect/madvise, or in a fork, the helper detaches untouched and tries again
  (`TRIES` times, 20 ms apart).
- **The vector registers put back.** The thread may have been stopped in the middle of a
  vectorised loop (a CPU kernel of torch), and dlopen's own memcpy/strlen use those
  registers: the whole extended state (x87, SSE, AVX, AVX-512, AMX) is saved before the call
  and written back after it, at the kernel's own size (a smaller buffer, as gdb 13 uses, is
  refused with EFAULT on CPUs with AMX).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import sys
import time
from typing import Any

PTRACE_GETREGS, PTRACE_GETFPREGS, PTRACE_SETFPREGS = 12, 14, 15
PTRACE_GETREGSET, PTRACE_SETREGSET = 0x4204, 0x4205
NT_X86_XSTATE = 0x202
XSTATE_MAX = 1 << 16
FPREGS_SIZE = 512
REGS = 27  # unsigned longs in x86-64's user_regs_struct
ORIG_RAX, RIP = 15, 16
UNSAFE_SYSCALLS = {
    9: "mmap",
    10: "mprotect",
    11: "munmap",
    12: "brk",
    25: "mremap",
    28: "madvise",
    56: "clone",
    57: "fork",
    58: "vfork",
    435: "clone3",
}
PAUSE_S = 0.02
# the code a thread may hold dlopen's locks in: libc (malloc), the dynamic loader, and the
# malloc replacements a job may preload (their own arena locks)
GUARDED = (
    *("libc.so", "libc-", "ld-linux", "ld-musl", "ld-2."),
    *("libjemalloc", "libtcmalloc", "libmimalloc"),
)
MFD_CLOEXEC, MFD_EXEC = 0x1, 0x10


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def _ptrace(request: int, pid: int, addr: int, data: object) -> None:
    if _libc.ptrace(request, pid, addr, data) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request:#x}): {os.strerror(err)}")


def _guarded_code(pid: int) -> list[tuple[int, int, str]]:
    """The executable mappings of GUARDED code in `pid`."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6 or "x" not in parts[1]:
                continue
            name = os.path.basename(parts[5])
            if name.startswith(GUARDED):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, name))
    return out


def unsafe_place(pid: int, guarded: list[tuple[int, int, str]]) -> str | None:
    """Why the stopped thread must not be made to call dlopen now (None: it may)."""
    regs = (ctypes.c_ulong * REGS)()
    _ptrace(PTRACE_GETREGS, pid, 0, ctypes.byref(regs))
    nr = ctypes.c_long(regs[ORIG_RAX]).value
    if nr in UNSAFE_SYSCALLS:
        return f"in the {UNSAFE_SYSCALLS[nr]} system call"
    rip = regs[RIP]
    for lo, hi, name in guarded:
        if lo <= rip < hi and (nr < 0 or name.startswith("ld-")):
            return f"inside {name}'s code"
    return None


def save_vector_state(pid: int) -> tuple[int, ctypes.Array] | None:
    """The thread's whole extended register state (request, buffer), or None."""
    buf = ctypes.create_string_buffer(XSTATE_MAX)
    iov = _Iovec(ctypes.cast(buf, ctypes.c_void_p), XSTATE_MAX)
    try:
        _ptrace(PTRACE_GETREGSET, pid, NT_X86_XSTATE, ctypes.byref(iov))
        return PTRACE_SETREGSET, (ctypes.c_char * iov.len).from_buffer_copy(buf.raw[: iov.len])
    except OSError:
        pass
    fp = ctypes.create_string_buffer(FPREGS_SIZE)
    try:
        _ptrace(PTRACE_GETFPREGS, pid, 0, fp)
        return PTRACE_SETFPREGS, fp
    except OSError:
        return None


def restore_vector_state(pid: int, saved: tuple[int, ctypes.Array]) -> None:
    request, buf = saved
    if request == PTRACE_SETREGSET:
        iov = _Iovec(ctypes.cast(buf, ctypes.c_void_p), ctypes.sizeof(buf))
        _ptrace(PTRACE_SETREGSET, pid, NT_X86_XSTATE, ctypes.byref(iov))
    else:
        _ptrace(PTRACE_SETFPREGS, pid, 0, buf)


def _library_fd(data: bytes) -> int:
    """An anonymous file (memfd) holding the library: nothing on disk, no noexec mount."""
    for flags in (MFD_CLOEXEC | MFD_EXEC, MFD_CLOEXEC):
        try:
            fd = os.memfd_create("gpudiag-hooks", flags)
            break
        except OSError:
            continue
    else:
        raise OSError("memfd_create failed")
    os.write(fd, data)
    return fd


def inject(pid: int, data: bytes, tries: int) -> dict:
    """Make `pid`'s main thread dlopen the library at a safe place; what happened."""
    from pyinjector import attach  # the agent checked it is installed

    fd = _library_fd(data)
    path = f"/proc/{os.getpid()}/fd/{fd}".encode()
    guarded = _guarded_code(pid)
    where = None
    for attempt in range(1, tries + 1):
        stopped = time.perf_counter()
        with attach(pid) as injector:
            where = unsafe_place(pid, guarded)
            if where is None:
                kind = _inject_keeping_registers(pid, injector, path)
        if where is None:
            ms = (time.perf_counter() - stopped) * 1e3  # the main thread's pause, detach included
            return {"ok": True, "tries": attempt, "registers": kind, "stopped_ms": ms}
        time.sleep(PAUSE_S)
    return {"ok": False, "error": f"the main thread stayed at unsafe places ({where})"}


def _inject_keeping_registers(pid: int, injector: Any, path: bytes) -> str:
    """dlopen `path` in the stopped thread, its vector registers put back; which were."""
    saved = save_vector_state(pid)
    if saved is None:
        raise OSError("its vector registers could not be read")
    injector.inject(path)
    restore_vector_state(pid, saved)
    return "all" if saved[0] == PTRACE_SETREGSET else "SSE only"


def main(argv: list[str]) -> int:
    if platform.machine() != "x86_64":
        out = {"ok": False, "error": f"x86-64 only, not {platform.machine()}"}
    else:
        try:
            if len(argv) > 3 and argv[3] and argv[3] not in sys.path:
                sys.path.append(argv[3])
            out = inject(int(argv[1]), sys.stdin.buffer.read(), int(argv[2]))
        except Exception as exc:  # noqa: BLE001 (the agent reads one line whatever happened)
            first = (str(exc).strip().splitlines() or [""])[0]  # pyinjector adds its advice
            out = {"ok": False, "error": f"{type(exc).__name__}: {first}"[:400]}
    sys.stdout.write(json.dumps(out) + "\n")  # one line to the agent, on a pipe
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
