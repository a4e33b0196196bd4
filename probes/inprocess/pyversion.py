"""A process's Python version, read from the process and its files, never by running them.

gpudiag may be root and the job another user's: running the job's interpreter to ask it
(`/proc/PID/exe -c ...`) runs that user's code as root (a private python next to its own
`encodings` package). So the version is read: from the libpython the process maps, from the
`Py_Version` constant its executable exports (CPython 3.11 and later, whether libpython is
linked in statically or not), or from the ABI tag of the extension modules it maps
(`_C.cpython-311-x86_64-linux-gnu.so`, torch's own among them).
"""

from __future__ import annotations

import os
import re
import struct

from gpudiag.probes.files import FileRefused, open_regular_fd

MAX_MAPS_BYTES = 8 << 20  # of /proc/PID/maps read (a job maps its libraries early on)
MAX_SECTION_BYTES = 4 << 20  # of one ELF section read (a python's .dynsym: about 100 KB)
_LIBPYTHON = re.compile(rb"libpython(\d)\.(\d+)")
_ABI_TAG = re.compile(rb"\.cpython-(\d)(\d+)[a-z]*-")
SHT_DYNSYM = 11
SYMBOL = b"Py_Version"


def version_of(pid: int) -> tuple[int, int] | None:
    """The Python major.minor process `pid` runs, read without running anything; None when
    nothing tells."""
    maps = _maps(pid)
    m = _LIBPYTHON.search(maps)
    if m:
        return int(m.group(1)), int(m.group(2))
    got = exported_version(f"/proc/{pid}/exe")
    if got is not None:
        return got
    tags = {(int(a), int(b)) for a, b in _ABI_TAG.findall(maps)}
    return tags.pop() if len(tags) == 1 else None


def _maps(pid: int) -> bytes:
    try:
        fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    chunks: list[bytes] = []
    size = 0
    try:
        while size < MAX_MAPS_BYTES and (chunk := os.read(fd, 1 << 16)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks)


def exported_version(path: str) -> tuple[int, int] | None:
    """(major, minor) from the `Py_Version` constant an ELF file exports (PY_VERSION_HEX);
    None when it exports none or is not an ELF file gpudiag can read."""
    try:
        fd, _st = open_regular_fd(path)
    except OSError:
        return None
    try:
        value = _symbol_u32(fd, SYMBOL)
    except (OSError, ValueError, struct.error, FileRefused):
        return None
    finally:
        os.close(fd)
    if value is None:
        return None
    major, minor = (value >> 24) & 0xFF, (value >> 16) & 0xFF
    return (major, minor) if major == 3 and minor < 100 else None


def _symbol_u32(fd: int, name: bytes) -> int | None:
    """The integer a dynamic symbol of a 64-bit ELF file names (4 or 8 bytes)."""
    head = os.pread(fd, 64, 0)
    if head[:4] != b"\x7fELF" or head[4] != 2:  # ELF64 only
        return None
    end = "<" if head[5] == 1 else ">"
    (shoff,) = struct.unpack_from(end + "Q", head, 0x28)
    shentsize, shnum = struct.unpack_from(end + "HH", head, 0x3A)
    if shentsize != 64 or not 0 < shnum < 4096:
        return None
    table = os.pread(fd, shentsize * shnum, shoff)
    sections = [struct.unpack_from(end + "IIQQQQIIQQ", table, i * 64) for i in range(shnum)]
    for sec in sections:
        if sec[1] != SHT_DYNSYM or sec[6] >= shnum or sec[9] != 24:
            continue
        syms = _section(fd, sec)
        strtab = _section(fd, sections[sec[6]])
        for i in range(0, len(syms) - 23, 24):
            st_name, _info, _other, shndx, value, _size = struct.unpack_from(
                end + "IBBHQQ", syms, i
            )
            if strtab[st_name : st_name + len(name) + 1] != name + b"\0":
                continue
            if not 0 < shndx < shnum:
                return None
            home = sections[shndx]  # sh_addr [3], sh_offset [4], sh_size [5]
            if not home[3] <= value < home[3] + home[5] or home[1] == 8:  # NOBITS
                return None
            width = 8 if _size == 8 else 4  # an unsigned long, or an int
            data = os.pread(fd, width, home[4] + value - home[3])
            if len(data) != width:
                return None
            return int(struct.unpack(end + ("Q" if width == 8 else "I"), data)[0])
    return None


def _section(fd: int, sec: tuple) -> bytes:
    offset, size = sec[4], sec[5]
    if size > MAX_SECTION_BYTES:
        raise ValueError("section too large")
    return os.pread(fd, size, offset)
