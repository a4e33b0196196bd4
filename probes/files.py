"""The one bounded reader of files gpudiag reads: every file it reads goes through here.

Only a regular file is read (after resolving links: a FIFO, a device or /dev/zero is refused
before a byte is read, never waited on: the open is non-blocking), at most `limit` bytes of
it, and, where another user could have planted it, only when its owner is one of `owners`.
A file read on behalf of a job (the source file a stack frame names) is read only when the
job's own user could read it: gpudiag running as root must not copy a root-only file into a
recording. `agent/base/safeio.py` turns a refusal into a one-line usage error; the probes
treat it as "not available".
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass


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
    return Reader(uid, frozenset(gids))


def refuse_untrusted(path: str | os.PathLike, st: os.stat_result, uid: int) -> None:
    """FileRefused unless a file found rather than named (./pyproject.toml) is `uid`'s or
    root's and writable by neither its group nor others (another user could have planted or
    changed it)."""
    if st.st_uid not in (uid, 0):
        raise FileRefused(f"{path} belongs to another user (uid {st.st_uid})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        raise FileRefused(f"{path} is writable by {who} (chmod go-w {os.fspath(path)})")


def open_regular_fd(
    path: str | os.PathLike, owners: frozenset[int] | set[int] | None = None
) -> tuple[int, os.stat_result]:
    """A read-only descriptor of a regular file and its stat; FileRefused when it is not one
    (or, with `owners`, when another user owns it). Never blocks on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{path} is {kind_of(st.st_mode)}, not a regular file")
        if owners is not None and st.st_uid not in owners:
            raise FileRefused(f"{path} belongs to another user (uid {st.st_uid})")
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


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
    fd, st = open_regular_fd(path, owners)
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
