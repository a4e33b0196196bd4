"""Reading what users hand gpudiag and writing what it makes, safely.

Readers: only regular files (after resolving links; a FIFO, a device or /dev/zero is refused
before any byte is read), through a bounded reader; JSON and TOML parsed with non-finite
numbers, huge integers and deep nesting refused in one line naming the file.

Writer: every file gpudiag writes goes through `atomic_write`: a random name in the target
folder opened with O_EXCL|O_NOFOLLOW (a planted link or file is never followed), written,
then renamed over the target; 0600 unless asked otherwise; nothing left behind on failure.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import re
import secrets
import stat
import sys
from collections.abc import Iterator
from typing import IO

from gpudiag.agent.base.errors import UsageError
from gpudiag.probes.files import FileRefused, kind_of, open_regular_fd, refuse_untrusted

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# limits on what a reader accepts (module settings: tests lower them)
MAX_DEPTH = 64  # nesting of JSON/TOML values: a report nests about 8 deep
MAX_INT_DIGITS = 30  # a count, a pid, a time in ns: 19 digits; refuse 5,000-digit integers
DEFAULT_FILE_MODE = 0o600  # reports, recordings and exports hold command lines and stacks
FILE_MODES = {"0600": 0o600, "0640": 0o640, "0644": 0o644}  # GPUDIAG_FILE_MODE may ask
_CHUNK = 1 << 16


class WriteError(UsageError):
    """A file gpudiag was asked to write could not be written (full disk, no permission)."""


class Untrusted(UsageError):
    """A file found rather than named is another user's or writable by others."""


def open_regular(path: str | os.PathLike, what: str, trusted_for: int | None = None) -> IO[bytes]:
    """The file opened for binary reading; UsageError unless it is a regular file after
    resolving links (through `probes/files.py`, the one reader: a FIFO cannot hang us);
    with `trusted_for` (a uid), Untrusted unless that user or root owns it and only they
    may write it."""
    try:
        fd, st = open_regular_fd(path)
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except FileRefused as exc:
        raise UsageError(f"{what} {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    if trusted_for is not None:
        try:
            refuse_untrusted(path, st, trusted_for)
        except FileRefused as exc:
            os.close(fd)
            raise Untrusted(f"{what} {exc}") from None
    return os.fdopen(fd, "rb")


def read_bounded(
    path: str | os.PathLike, limit: int, what: str, trusted_for: int | None = None
) -> bytes:
    """At most `limit` bytes of a regular file; UsageError when it holds more (Untrusted,
    with `trusted_for`, as `open_regular`)."""
    with open_regular(path, what, trusted_for) as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise UsageError(f"{what} {path} is too large (over {limit} bytes)")
    return data


def bounded_lines(
    f: IO[bytes] | io.BufferedIOBase, max_line: int, max_total: int, where: str
) -> Iterator[bytes]:
    """Lines of a binary stream (a gzip file), each at most `max_line` bytes and all of them
    at most `max_total`: UsageError past either, read no further than the bound."""
    total = 0
    n = 0
    while True:
        line = f.readline(max_line + 1)
        if not line:
            return
        n += 1
        total += len(line)
        if len(line) > max_line:
            raise UsageError(f"{where}: line {n} is longer than {max_line} bytes")
        if total > max_total:
            raise UsageError(f"{where} holds more than {max_total} bytes decompressed")
        yield line


def _bad_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:20]} out of range")
    return v


_CONTAINERS = (dict, list)
_NUMBERS = frozenset((int, float, bool))
_INT_LIMIT = 10**MAX_INT_DIGITS


def _scalar_ok(v: object, where: str, allow_nonfinite: bool) -> None:
    if isinstance(v, float) and not allow_nonfinite and not math.isfinite(v):
        raise UsageError(f"{where}: non-finite number {v}")
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= _INT_LIMIT:
        raise UsageError(f"{where}: integer of {len(str(abs(v)))} digits")


def _numbers_ok(items: list, where: str, allow_nonfinite: bool) -> None:
    """A list of numbers checked in bulk (C loops: a recording holds millions of them);
    item by item only when one may be out of bounds."""
    if not max(map(abs, items)) < _INT_LIMIT or (  # (a NaN compares false: checked 1 by 1)
        not allow_nonfinite and not all(map(math.isfinite, items))
    ):
        for x in items:
            _scalar_ok(x, where, allow_nonfinite)


def check_value(value: object, where: str, allow_nonfinite: bool = False) -> None:
    """UsageError when a parsed value nests deeper than MAX_DEPTH, or holds a non-finite
    number or an integer with more than MAX_INT_DIGITS digits (walked without recursion,
    lists of numbers checked in bulk)."""
    if not isinstance(value, _CONTAINERS):
        _scalar_ok(value, where, allow_nonfinite)
        return
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise UsageError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        items = list(v.values()) if isinstance(v, dict) else v
        if not items:
            continue
        kinds = set(map(type, items))
        if kinds <= _NUMBERS:
            _numbers_ok(items, where, allow_nonfinite)
            continue
        for x in items:
            if isinstance(x, _CONTAINERS):
                stack.append((x, depth + 1))
            else:
                _scalar_ok(x, where, allow_nonfinite)


def parse_json(
    data: bytes | str, where: str, allow_nonfinite: bool = False, kind: str = "JSON"
) -> object:
    """A JSON value; UsageError naming `where` for invalid JSON, NaN/Infinity (unless
    `allow_nonfinite`: a recording's unmeasured values), huge integers or deep nesting."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        if allow_nonfinite:  # integers parsed in C: check_value bounds their digits
            value = json.loads(text)
        else:
            value = json.loads(text, parse_constant=_bad_constant, parse_float=_float)
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not {kind} (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{where} is not {kind} (invalid JSON at line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise UsageError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # a non-finite number, or an integer past Python's digit limit
        digits = re.search(r"value has (\d+) digits", str(exc))
        raise UsageError(
            f"{where}: integer of {digits[1]} digits" if digits else f"{where}: {exc}"
        ) from None
    check_value(value, where, allow_nonfinite)
    if _SURROGATE_ESCAPE.search(text):  # rare: only then is every string looked at
        _no_lone_surrogates(value, where)
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _no_lone_surrogates(value: object, where: str) -> None:
    """UsageError when a parsed value holds half a surrogate pair (`"\\ud800"`: valid JSON,
    but no character, and no file or terminal can take it)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{where}: a string holds a lone surrogate (\\ud800-\\udfff)") from None


def parse_toml(data: bytes, where: str) -> dict:
    """A TOML document; UsageError naming `where` for invalid TOML, nan/inf, huge integers
    or deep nesting."""
    try:
        value = tomllib.loads(data.decode("utf-8"), parse_float=_float)
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not a TOML file (not UTF-8 text)") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{where} is not valid TOML: {exc}") from None
    except RecursionError:
        raise UsageError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # a float out of range, or an integer past Python's digit limit
        why = "integer too large" if "digits" in str(exc) else str(exc)
        raise UsageError(f"{where}: {why}") from None
    check_value(value, where)
    return value


def finite(obj: object) -> object:
    """A copy of a JSON-able value with every non-finite number replaced by null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps_json(obj: object, indent: int | None = None) -> str:
    """Strict JSON text: a non-finite number becomes null, never a NaN or Infinity token."""
    seps = None if indent else (",", ":")
    return json.dumps(finite(obj), indent=indent, separators=seps, allow_nan=False)


def file_mode() -> int:
    """The mode of the files gpudiag writes: 0600, or what GPUDIAG_FILE_MODE asks (0640,
    0644); UsageError for any other value."""
    asked = os.environ.get("GPUDIAG_FILE_MODE", "").strip()
    if not asked:
        return DEFAULT_FILE_MODE
    if asked.rjust(4, "0") not in FILE_MODES:
        raise UsageError(f"GPUDIAG_FILE_MODE={asked!r}: use 0600, 0640 or 0644")
    return FILE_MODES[asked.rjust(4, "0")]


def _private_temp(folder: str, name: str) -> tuple[int, str]:
    """A new file at a random name in `folder` (O_EXCL|O_NOFOLLOW: never a planted one)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(16):
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(17, "no free temporary name")


def _in_place(path: str) -> bool:
    """Whether `path` is written into rather than replaced: a device or FIFO (`/dev/null`),
    or a link that root or we made to one (`/dev/stdout`): renaming over it would replace
    the node, or the system's link. A FIFO another user made (planted to receive what we
    write) is refused; a link another user made is replaced, never followed."""
    if own_fd(path) is not None:
        return True
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (0, os.geteuid()):
            return False
        try:
            st = os.stat(path)
        except OSError:
            return False
        return not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return False
    if stat.S_ISFIFO(st.st_mode) and st.st_uid not in (0, os.geteuid()):
        raise FileRefused(errno.EPERM, f"{kind_of(st.st_mode)} another user made")
    return True


_OWN_FD = re.compile(r"/(?:proc/(?:self|thread-self|\d+)|dev)/fd/(\d+)")


def own_fd(path: str) -> int | None:
    """The descriptor of this process that `path` names through links root or we made
    (`/dev/stdout` -> /proc/self/fd/1): written through, whatever it is open on (a file the
    shell redirected stdout to); None when it names none."""
    for _ in range(8):
        m = _OWN_FD.fullmatch(path)
        if m and path.split("/")[2] in ("self", "thread-self", "fd", str(os.getpid())):
            return int(m.group(1))  # (a closed one: the write fails, nothing is replaced)
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISLNK(st.st_mode) or st.st_uid not in (0, os.geteuid()):
            return None
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return None


def _open_in_place(path: str) -> int:
    """A blocking descriptor of the device or FIFO at `path` (opened non-blocking: a FIFO
    nobody reads is an error, not a hang), or a copy of our own descriptor it names; never
    a regular file otherwise (a link swapped meanwhile)."""
    mine = own_fd(path)
    if mine is not None:
        return os.dup(mine)
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileRefused(errno.EPERM, "a link to a regular file")
    os.set_blocking(fd, True)
    return fd


def create_stream(path: str | os.PathLike, what: str = "file") -> IO[bytes]:
    """A new, empty file at `path` for streaming writes (a recording), made like
    `atomic_write` makes its files: whatever stood at `path` (a planted link) is replaced,
    never followed. WriteError when it cannot be made."""
    path = os.fspath(path)
    tmp = None
    try:
        if _in_place(path):
            return os.fdopen(_open_in_place(path), "wb")
        fd, tmp = _private_temp(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
        f = os.fdopen(fd, "wb")
        os.fchmod(fd, file_mode())
        os.replace(tmp, path)
        return f
    except OSError as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise WriteError(f"cannot write {what} {path}: {exc.strerror or exc}") from None


def atomic_write(
    path: str | os.PathLike, data: str | bytes, what: str = "file", mode: int | None = None
) -> str:
    """Write `data` to `path` atomically and privately; the absolute path written.
    WriteError (one line naming the file) when it cannot be; nothing is left behind."""
    path = os.fspath(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = fd = None
    try:
        if _in_place(path):
            fd = _open_in_place(path)
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            return os.path.abspath(path)
        fd, tmp = _private_temp(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, file_mode() if mode is None else mode)
        os.fsync(fd)
        os.close(fd)
        fd = None
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise WriteError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return os.path.abspath(path)


def append_text(path: str | os.PathLike, text: str, what: str = "file") -> str:
    """Append `text` to an existing or new regular file (a CI step summary): never through
    a link (O_NOFOLLOW), never into a FIFO or device (opened non-blocking, then refused: a
    FIFO cannot hang us); a new file is 0600. WriteError naming the file otherwise."""
    path = os.fspath(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, file_mode())
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise FileRefused(errno.EPERM, f"{kind_of(mode)}, not a regular file")
            os.set_blocking(fd, True)
            view = memoryview(text.encode("utf-8"))
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as exc:
        raise WriteError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    return os.path.abspath(path)


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_distinct(paths: dict[str, str | None]) -> None:
    """UsageError when two outputs (option -> path) name one file: each would overwrite the
    other and both say "written". Devices (`/dev/null`, `/dev/stdout`) may be shared."""
    named = [(opt, p) for opt, p in paths.items() if p]
    for i, (opt_a, a) in enumerate(named):
        for opt_b, b in named[i + 1 :]:
            if _same_file(a, b) and not _in_place_safe(a):
                raise UsageError(f"{opt_a} and {opt_b} name the same file {a}: give each its own")


def _in_place_safe(path: str) -> bool:
    try:
        return _in_place(path)
    except OSError:
        return False
