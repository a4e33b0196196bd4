"""The one bounded reader of files gpudiag reads: every file it reads goes through here.

Only a regular file is read (after resolving links: a FIFO, a device or /dev/zero is refused
before a byte is read, never waited on: the open is non-blocking), at most `limit` bytes of
it, and, where another user could have planted it, only when its owner is one of `owners`.
A file read on behalf of a job (the source file a stack frame names) is read with the job's
own file-system credentials (`read_as`: its uid, gid and groups, in a thread of its own), so
the kernel judges every folder on the path as it would for the job: gpudiag running as root
must not copy a root-only file, or one inside another user's 0700 home, into a recording.
A path is first opened with O_PATH, which opens nothing: a device (a pty that would become the
controlling terminal, a watchdog) is refused before its driver sees an open, and the real open
adds O_NOCTTY besides. Files of procfs, sysfs and the like are refused too: their mode bits
are not their rule (/proc/1/maps is 0444). `agent/base/safeio.py` turns a refusal into a
one-line usage error; the probes treat it as "not available".
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# statfs f_type of file systems whose files are not data (their mode bits are not their rule)
PSEUDO_FS = {
    0x9FA0: "procfs",
    0x62656572: "sysfs",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0x73636673: "securityfs",
    0x27E0EB: "cgroupfs",
    0x63677270: "cgroup2fs",
    0xCAFE4A11: "bpffs",
    0x62656570: "configfs",
    0x6165676C: "pstorefs",
    0xDE5E81E4: "efivarfs",
}
# a job's process files whose size the job chooses (its environment and command line up to
# ARG_MAX, a memory map of up to 65,530 lines): read only through read_head, to these limits
MAX_ENVIRON_BYTES = 1 << 20
MAX_CMDLINE_BYTES = 1 << 20
MAX_MAPS_BYTES = 4 << 20
_SETGROUPS = {"x86_64": 116, "aarch64": 159}  # the raw syscall: glibc's applies to all threads


class FileRefused(OSError):
    """A file that is not read: not a regular file, another user's, or too large."""


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


@dataclass(frozen=True)
class Reader:
    """Who a file is read for: its user and groups (a job's, from /proc/PID/status)."""

    uid: int
    gids: frozenset[int]
    gid: int | None = None  # the primary (effective) group

    def may_read(self, st: os.stat_result) -> bool:
        """Whether this user could read a file with these permissions (root: anything)."""
        if self.uid == 0:
            return True
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IRUSR)
        if st.st_gid in self.gids:
            return bool(st.st_mode & stat.S_IRGRP)
        return bool(st.st_mode & stat.S_IROTH)


def reader_of(pid: int) -> Reader | None:
    """The user and groups process `pid` reads files as (None when it cannot be told)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        uid = int(fields["Uid"].split()[1])  # effective
        gids = {int(fields["Gid"].split()[1])}
        gids.update(int(g) for g in fields.get("Groups", "").split())
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return Reader(uid, frozenset(gids), int(fields["Gid"].split()[1]))


def refuse_untrusted(path: str | os.PathLike, st: os.stat_result, uid: int) -> None:
    """FileRefused unless a file found rather than named (./pyproject.toml) is `uid`'s or
    root's and writable by neither its group nor others (another user could have planted or
    changed it)."""
    if st.st_uid not in (uid, 0):
        raise FileRefused(f"{path} belongs to another user (uid {st.st_uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        raise FileRefused(f"{path} is writable by {who} (chmod go-w {os.fspath(path)})")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def fs_type(fd: int) -> int | None:
    """The statfs f_type of the file system `fd` is on (None when it cannot be told)."""
    buf = ctypes.create_string_buffer(256)
    try:
        if _libc().fstatfs(fd, buf) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return int.from_bytes(buf.raw[: ctypes.sizeof(ctypes.c_long)], "little", signed=False)


def open_regular_fd(
    path: str | os.PathLike, owners: frozenset[int] | set[int] | None = None
) -> tuple[int, os.stat_result]:
    """A read-only descriptor of a regular file and its stat; FileRefused when it is not one
    (or, with `owners`, when another user owns it). The path is opened with O_PATH first and
    judged by that descriptor, so no device's driver ever sees an open; the file itself is
    then opened through it (the same inode) with O_NOCTTY and O_NONBLOCK."""
    pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path} is {kind_of(st.st_mode)}, not a regular file")
        kind = PSEUDO_FS.get(fs_type(pfd) or 0)
        if kind is not None:
            raise FileRefused(f"{path} is on {kind}, not a file of data")
        if owners is not None and st.st_uid not in owners:
            raise FileRefused(f"{path} belongs to another user (uid {st.st_uid})")
        fd = os.open(
            f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC
        )
    finally:
        os.close(pfd)
    try:
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(st2.st_mode):
            raise FileRefused(f"{path} changed while it was opened")
        os.set_blocking(fd, True)
        return fd, st2
    except BaseException:
        os.close(fd)
        raise


def read_as(reader: Reader | None, fn: Callable[[], T]) -> T:
    """`fn()` run with `reader`'s file-system credentials (fsuid, fsgid, groups), in a thread
    of its own that ends with them, when gpudiag is root and the reader is not; as is
    otherwise (a non-root gpudiag's own rights are already no more than the job's). The
    kernel then checks every folder on a path as it would for the job."""
    if reader is None or reader.uid == 0 or os.geteuid() != 0:
        return fn()
    out: list[T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            _become(reader)
            out.append(fn())
        except BaseException as e:  # handed to the caller's thread
            err.append(e)

    t = threading.Thread(target=run, name="gpudiag-read-as", daemon=True)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def _become(reader: Reader) -> None:
    """This thread's groups, fsgid and fsuid set to the reader's (FileRefused if not done)."""
    nr = _SETGROUPS.get(platform.machine())
    if nr is None:
        raise FileRefused(f"cannot read as uid {reader.uid} on {platform.machine()}")
    libc = _libc()
    gids = sorted(reader.gids) or [reader.uid]
    arr = (ctypes.c_uint * len(gids))(*gids)
    if libc.syscall(nr, len(gids), arr) != 0:
        raise FileRefused(f"setgroups failed: {os.strerror(ctypes.get_errno())}")
    gid = reader.gid if reader.gid is not None else gids[0]
    libc.setfsgid(gid)
    libc.setfsuid(reader.uid)
    # each returns the previous value: called again, it says what the value now is
    if libc.setfsgid(gid) != gid or libc.setfsuid(reader.uid) != reader.uid:
        raise FileRefused(f"could not take uid {reader.uid}'s credentials to read")


def read_regular(
    path: str | os.PathLike,
    limit: int,
    owners: frozenset[int] | set[int] | None = None,
    reader: Reader | None = None,
    since: float | None = None,
) -> bytes:
    """At most `limit` bytes of a regular file: FileRefused when it holds more, when
    another user than `owners` owns it, when `reader` could not read it, or when it was
    last written before `since` (epoch seconds)."""
    fd, st = read_as(reader, lambda: open_regular_fd(path, owners))
    with os.fdopen(fd, "rb") as f:
        if reader is not None and not reader.may_read(st):
            raise FileRefused(f"{path} is not readable by uid {reader.uid}")
        if since is not None and st.st_mtime < since:
            raise FileRefused(f"{path} was written before this session")
        if st.st_size > limit:
            raise FileRefused(f"{path} is too large (over {limit} bytes)")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileRefused(f"{path} is too large (over {limit} bytes)")
    return data


def read_tail(path: str | os.PathLike, limit: int) -> bytes:
    """The last `limit` bytes (at most) of a regular file (a job's stderr log)."""
    fd, st = open_regular_fd(path)
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            f.seek(st.st_size - limit)
        return f.read(limit)


def read_head(path: str | os.PathLike, limit: int) -> bytes:
    """At most `limit` bytes from the start of a (procfs) file; OSError when unreadable. The
    one reader of a job's process files whose size the job chooses (environ, cmdline, maps):
    tests/test_choke_points.py fails on one read around it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        chunks: list[bytes] = []
        size = 0
        while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


MAX_DESCENDANTS = 4096  # processes descendants() lists at most
MAX_CHILDREN_BYTES = 64 * 1024  # of one thread's list of children
CHILDREN_READS = 32  # threads of one process whose children list one descendants() reads


class ChildrenTurns:
    """Which threads' children lists descendants() reads: all of them up to `limit` threads;
    past it the main thread and `limit - 1` others in turn, the children each thread listed
    at its last read kept (while their parent is still that process). A job's 1,500 idle
    threads cost 1,500 reads per look at its tree (25 ms of CPU, about five looks a tick
    under watch: more than a job's share of the budget); now `limit`, and a child started by
    another thread than the main one is found within threads / (limit - 1) looks."""

    def __init__(self, limit: int = CHILDREN_READS, keep: int = MAX_DESCENDANTS) -> None:
        self.limit, self.keep = max(2, limit), keep
        self._lock = threading.Lock()
        self._turn: dict[int, int] = {}  # pid -> where its rotation stands
        self._kids: dict[int, dict[str, list[int]]] = {}  # pid -> tid -> children seen

    def choose(self, pid: int, tids: list[str]) -> list[str]:
        """The threads of `pid` to read now (its main thread first)."""
        if len(tids) <= self.limit:
            return tids
        rest = sorted(t for t in tids if t != str(pid))
        with self._lock:
            at = self._turn.get(pid, 0) % len(rest)
            n = self.limit - (len(rest) < len(tids))
            self._turn[pid] = at + n
            if len(self._turn) > self.keep:  # pids long gone: start again
                self._turn.clear()
        head = [str(pid)] if len(rest) < len(tids) else []
        return head + (rest + rest)[at : at + n]

    def children(self, pid: int, tids: list[str], read: dict[str, list[int]]) -> list[int]:
        """The children of `pid`: those of the threads `read` now, and those its other live
        threads listed before, while `pid` is still their parent."""
        if len(read) == len(tids):
            with self._lock:
                self._kids.pop(pid, None)
            return [k for kids in read.values() for k in kids]
        live = set(tids)
        with self._lock:
            known = {t: k for t, k in self._kids.get(pid, {}).items() if t in live}
            known.update(read)
            if len(self._kids) > self.keep:
                self._kids.clear()
            self._kids[pid] = known
        out = [k for t, kids in known.items() for k in kids if t in read or _parent(k) == pid]
        return out


TURNS = ChildrenTurns()


def _parent(pid: int, root: Path = Path("/proc")) -> int:
    """The parent pid of `pid` (0 when it is gone)."""
    try:
        text = read_head(root / str(pid) / "stat", 1024)
        return int(text[text.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def descendants(
    pid: int, root: Path = Path("/proc"), turns: ChildrenTurns | None = None
) -> list[int]:
    """The processes `pid` started, and theirs, from each of their threads'
    /proc/PID/task/TID/children: no scan of every process on the box, as psutil's
    children() makes (gpudiag's cost must not grow with the box's processes); psutil's
    where the kernel lists no children (CONFIG_PROC_CHILDREN), [] when `pid` is gone. At
    most `CHILDREN_READS` threads of a process are read per call (`ChildrenTurns`)."""
    turns = TURNS if turns is None else turns
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < MAX_DESCENDANTS:
        p = todo.pop()
        try:
            tids = [t for t in os.listdir(root / str(p) / "task") if t.isdigit()]
        except OSError:
            continue
        read: dict[str, list[int]] = {}
        for tid in turns.choose(p, tids):
            try:
                raw = read_head(root / str(p) / "task" / tid / "children", MAX_CHILDREN_BYTES)
            except FileNotFoundError:
                if p == pid and tid == str(pid) and (root / str(pid)).exists():
                    return _psutil_descendants(pid)
                continue
            except OSError:
                continue
            read[tid] = [int(x) for x in raw.split() if x.isdigit()]
        kids = turns.children(p, tids, read)
        out += kids
        todo += kids
    return out[:MAX_DESCENDANTS]


def _psutil_descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [k.pid for k in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []
