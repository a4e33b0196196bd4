"""A job's Python version, read and never asked: nothing of the job is executed.

Issue 53: running `/proc/PID/exe -c ...` to learn the version ran another user's code as
root (their own `encodings` beside their interpreter). The version is read instead:
- from the libpython the job maps (`libpython3.11.so.1.0`), else
- from its executable's dynamic symbols, read as a file through /proc/PID/exe: `Py_Version`
  (3.11+, the PY_VERSION_HEX constant in its read-only data), else `Py_IsNone` (3.10 added
  it) says 3.10, else `Py_Initialize` says older than 3.10; an executable that defines none
  and needs `libpython3.X.so` (not mapped yet: a job just started) is 3.X.
The file is read with bounds on every size (the job's owner made it: it is data).
"""

from __future__ import annotations

import re
import struct
from typing import BinaryIO

from gpudiag.probes.files import MAX_MAPS_BYTES, read_head

MAX_SECTIONS = 4096
MAX_SYMBOLS = 1 << 20
MAX_EXE = 1 << 31
EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
SHDR = struct.Struct("<IIQQQQIIQQ")
SYM = struct.Struct("<IBBHQQ")
SHT_DYNSYM = 11
OLDER = (3, 9)  # what an interpreter without 3.10's symbols is taken for


def python_version(pid: int) -> tuple[int, int] | None:
    """The job's Python major.minor, or None when it cannot be read from here."""
    try:
        maps = read_head(f"/proc/{pid}/maps", MAX_MAPS_BYTES).decode(errors="replace")
        m = re.search(r"libpython(\d)\.(\d+)", maps)
        if m:
            return int(m.group(1)), int(m.group(2))
        with open(f"/proc/{pid}/exe", "rb") as exe:
            return exe_version(exe)
    except (OSError, ValueError, struct.error):
        return None


def exe_version(exe: BinaryIO) -> tuple[int, int] | None:
    """The version a CPython executable (an open binary file) was built as."""
    symbols = _dynamic_symbols(exe)
    if symbols is None:
        return None
    if "Py_Version" in symbols:
        value = _read_at(exe, symbols["Py_Version"], 4)
        if value is not None:
            hexversion = struct.unpack("<I", value)[0]
            return hexversion >> 24, (hexversion >> 16) & 0xFF
    if "Py_IsNone" in symbols:
        return 3, 10
    if "Py_Initialize" in symbols:
        return OLDER
    linked = symbols.get("libpython")  # an executable that needs libpython3.X.so
    return (3, linked[0]) if linked else None


def _sections(exe: BinaryIO) -> list[tuple] | None:
    exe.seek(0)
    head = exe.read(EHDR.size)
    if len(head) < EHDR.size or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None  # 64-bit little-endian only
    shoff, shentsize, shnum = EHDR.unpack(head)[6], *EHDR.unpack(head)[11:13]
    if shentsize != SHDR.size or not 0 < shnum <= MAX_SECTIONS or shoff > MAX_EXE:
        return None
    exe.seek(shoff)
    raw = exe.read(shnum * SHDR.size)
    if len(raw) < shnum * SHDR.size:
        return None
    return [SHDR.unpack_from(raw, i * SHDR.size) for i in range(shnum)]


def _dynamic_symbols(exe: BinaryIO) -> dict[str, tuple[int, tuple]] | None:
    """Defined dynamic symbols we look for: name -> (value, its section header); and
    "libpython" -> (minor, ()) where the file needs libpython3.<minor>."""
    sections = _sections(exe)
    if sections is None:
        return None
    wanted = {b"Py_Version", b"Py_IsNone", b"Py_Initialize"}
    out: dict[str, tuple[int, tuple]] = {}
    for sec in sections:
        if sec[1] != SHT_DYNSYM or not 0 <= sec[6] < len(sections):
            continue
        strtab = sections[sec[6]]
        count = min(sec[5] // SYM.size, MAX_SYMBOLS)
        exe.seek(sec[4])
        syms = exe.read(count * SYM.size)
        exe.seek(strtab[4])
        names = exe.read(min(strtab[5], 1 << 24))
        needed = re.search(rb"\0libpython3\.(\d+)", names)
        if needed:
            out["libpython"] = (int(needed.group(1)), ())
        for i in range(len(syms) // SYM.size):
            name_at, _info, _other, shndx, value, _size = SYM.unpack_from(syms, i * SYM.size)
            name = names[name_at : names.find(b"\0", name_at)]
            if name in wanted and 0 < shndx < len(sections):
                out[name.decode()] = (value, sections[shndx])
    return out


def _read_at(exe: BinaryIO, symbol: tuple[int, tuple], size: int) -> bytes | None:
    """`size` bytes of a symbol's initial value from its section in the file."""
    value, sec = symbol
    addr, offset, sec_size = sec[3], sec[4], sec[5]
    if not addr <= value <= addr + sec_size - size:
        return None
    exe.seek(offset + value - addr)
    data = exe.read(size)
    return data if len(data) == size else None
