"""A tiny ELF shared object whose only deed is to queue a Python script on the main thread.

`attach --hooks` without gdb: an injector (pyinjector, a ptrace wrapper of kubo/injector)
makes the job's main thread dlopen a library. This module writes that library, byte by
byte, with no compiler: one read-only segment (ELF header, a symbol table naming
`Py_AddPendingCall` and `PyRun_SimpleString`, 20 bytes of x86-64 code, the script) and one
read-write segment (the dynamic section and the two slots the loader fills). Its DT_INIT does
what gdb did by hand:

    Py_AddPendingCall(PyRun_SimpleString, script)

so the script runs at the interpreter's next safe point (as a signal handler does), never in
the middle of whatever the main thread was doing when it was stopped; and only while
`Py_IsInitialized()` (a job already in Py_Finalize has no interpreter to queue on: the call
would read through a null pointer, seen on jobs injected as they exited). The library is marked
NODELETE: the script it holds must stay mapped until the pending call has run. Both symbols
are bound when it loads (BIND_NOW): an interpreter that does not export them (an embedded
Python loaded with RTLD_LOCAL) makes dlopen fail with its own message, nothing is run.
"""

from __future__ import annotations

import platform
import struct

MACHINES = {"x86_64": 62}  # EM_X86_64; the code below is x86-64 only
MAX_SCRIPT = 2048
ALIGN = 0x1000
SYMBOLS = ("Py_AddPendingCall", "PyRun_SimpleString", "Py_IsInitialized")
CODE_SIZE = 39
EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
PHDR = struct.Struct("<IIQQQQQQ")
SYM = struct.Struct("<IBBHQQ")
RELA = struct.Struct("<QQq")
DYN = struct.Struct("<qQ")
PT_LOAD, PT_DYNAMIC, PT_GNU_STACK = 1, 2, 0x6474E551
PF_X, PF_W, PF_R = 1, 2, 4
DT = {
    "NULL": 0,
    "HASH": 4,
    "STRTAB": 5,
    "SYMTAB": 6,
    "RELA": 7,
    "RELASZ": 8,
    "RELAENT": 9,
    "STRSZ": 10,
    "SYMENT": 11,
    "INIT": 12,
    "FLAGS": 30,
    "FLAGS_1": 0x6FFFFFFB,
}
DF_BIND_NOW = 0x8
DF_1_NOW, DF_1_NODELETE = 0x1, 0x8
R_X86_64_GLOB_DAT = 6
STB_GLOBAL_STT_FUNC = (1 << 4) | 2


def supported() -> str | None:
    """Why this machine cannot use the library (None: it can)."""
    machine = platform.machine()
    if machine not in MACHINES:
        return f"the injected library is written for x86-64 only, not {machine}"
    return None


def _pad(buf: bytearray, align: int) -> None:
    buf.extend(b"\0" * (-len(buf) % align))


def _code(at: int, slots: dict[str, int], script: int) -> bytes:
    """x86-64: if Py_IsInitialized(): tail-call Py_AddPendingCall(PyRun_SimpleString,
    &script) (its return value is DT_INIT's, which the loader ignores); else return."""

    def rel(end: int, target: int) -> bytes:
        return struct.pack("<i", target - end)

    code = (
        b"\x48\x83\xec\x08"  # sub rsp, 8 (the stack 16-byte aligned for the call)
        + b"\xff\x15" + rel(at + 10, slots["Py_IsInitialized"])  # call [rip + ...]
        + b"\x48\x83\xc4\x08"  # add rsp, 8
        + b"\x85\xc0"  # test eax, eax
        + b"\x74\x14"  # jz ret (+20)
        + b"\x48\x8b\x3d" + rel(at + 25, slots["PyRun_SimpleString"])  # mov rdi, [rip + ...]
        + b"\x48\x8d\x35" + rel(at + 32, script)  # lea rsi, [rip + script]
        + b"\xff\x25" + rel(at + 38, slots["Py_AddPendingCall"])  # jmp [rip + ...]
        + b"\xc3"  # ret
    )  # fmt: skip
    assert len(code) == CODE_SIZE
    return code


def library(script: str) -> bytes:
    """The shared object (bytes) that queues `script` (ASCII, at most MAX_SCRIPT bytes)."""
    data = script.encode("ascii")
    if len(data) > MAX_SCRIPT or b"\0" in data:
        raise ValueError(f"the script must be ASCII without NUL, at most {MAX_SCRIPT} bytes")
    n_phdr = 4
    text = bytearray(EHDR.size + n_phdr * PHDR.size)
    _pad(text, 8)
    hash_at = len(text)
    nsym = 1 + len(SYMBOLS)
    text += struct.pack(f"<{3 + nsym}I", 1, nsym, 0, *([0] * nsym))
    _pad(text, 8)
    strtab = b"\0" + b"".join(s.encode() + b"\0" for s in SYMBOLS)
    names = [1 + sum(len(s) + 1 for s in SYMBOLS[:i]) for i in range(len(SYMBOLS))]
    symtab_at = len(text)
    text += SYM.pack(0, 0, 0, 0, 0, 0)
    for name in names:
        text += SYM.pack(name, STB_GLOBAL_STT_FUNC, 0, 0, 0, 0)
    strtab_at = len(text)
    text += strtab
    _pad(text, 8)
    rela_at = len(text)
    text += bytes(RELA.size * len(SYMBOLS))  # filled once the slots' place is known
    _pad(text, 16)
    code_at = len(text)
    text += bytes(CODE_SIZE)
    script_at = len(text)
    text += data + b"\0"
    rw_at = len(text) + (-len(text) % ALIGN)
    dyn = [
        ("HASH", hash_at),
        ("STRTAB", strtab_at),
        ("SYMTAB", symtab_at),
        ("STRSZ", len(strtab)),
        ("SYMENT", SYM.size),
        ("RELA", rela_at),
        ("RELASZ", RELA.size * len(SYMBOLS)),
        ("RELAENT", RELA.size),
        ("INIT", code_at),
        ("FLAGS", DF_BIND_NOW),
        ("FLAGS_1", DF_1_NOW | DF_1_NODELETE),
        ("NULL", 0),
    ]
    rw = bytearray(b"".join(DYN.pack(DT[k], v) for k, v in dyn))
    slots = {name: rw_at + len(rw) + 8 * i for i, name in enumerate(SYMBOLS)}
    rw += bytes(8 * len(SYMBOLS))
    for i, slot in enumerate(slots.values()):
        text[rela_at + i * RELA.size : rela_at + (i + 1) * RELA.size] = RELA.pack(
            slot, ((i + 1) << 32) | R_X86_64_GLOB_DAT, 0
        )
    text[code_at : code_at + CODE_SIZE] = _code(code_at, slots, script_at)
    text_size = len(text)
    phdrs = [
        (PT_LOAD, PF_R | PF_X, 0, 0, 0, text_size, text_size, ALIGN),
        (PT_LOAD, PF_R | PF_W, rw_at, rw_at, rw_at, len(rw), len(rw), ALIGN),
        (PT_DYNAMIC, PF_R | PF_W, rw_at, rw_at, rw_at, DYN.size * len(dyn), DYN.size * len(dyn), 8),
        (PT_GNU_STACK, PF_R | PF_W, 0, 0, 0, 0, 0, 16),
    ]
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    text[: EHDR.size] = EHDR.pack(
        ident, 3, MACHINES["x86_64"], 1, 0, EHDR.size, 0, 0, EHDR.size, PHDR.size, n_phdr, 64, 0, 0
    )
    for i, ph in enumerate(phdrs):
        at = EHDR.size + i * PHDR.size
        text[at : at + PHDR.size] = PHDR.pack(*ph)
    return bytes(text) + bytes(rw_at - text_size) + bytes(rw)
