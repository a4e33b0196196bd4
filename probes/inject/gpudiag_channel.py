"""The wire between the job's hooks and the agent, spelled once for both sides: the
environment variables that carry the channel, the fix and the step log, the width and fields
of a step row; and the one privacy check for every path the job's hooks touch (step,
collectives and capture channels, and the capture request file beside the socket).

A path is used only when its folder is a real folder (not a link) owned by this user that no
one else may enter or write (no group/other bits): a folder another local user pre-created
in /tmp (`/tmp/gpudiag-<uid>`, mode 777) is refused, so the job never sends its data there
nor takes requests from it. Imports nothing from gpudiag (the job may run in another
environment); the agent uses the same check for the folder it binds its socket in.
"""

from __future__ import annotations

import os
import secrets
import stat

CHANNEL_ENV = "GPUDIAG_CHANNEL"  # the agent's socket (run sets it, attach --hooks passes it)
FIX_ENV = "GPUDIAG_FIX"  # `try`: the fix an arm applies (JSON)
STEPS_ENV = "GPUDIAG_TRY_STEPS"  # `try`: the arm's step log
CAPTURE_ENV = "GPUDIAG_CAPTURE_STEPS"  # run --capture-steps N
AFTER_ENV = "GPUDIAG_CAPTURE_AFTER"  # the warm-up steps before the capture
# a step row: the wall time, then these (NaN where not measured)
STEP_FIELDS = (
    "step_time_s",
    "data_wait_s",
    "batch_size",
    "h2d_copy_s",
    "h2d_pinned",
    "h2d_pageable",
    "syncs",
    "sync_time_s",
)
STEP_WIDTH = 1 + len(STEP_FIELDS)


def folder_problem(folder: str) -> str | None:
    """Why `folder` is not private to this user, or None when it is. Asked again at every
    use (one lstat), never remembered: once the agent has left and removed its folder,
    another user may make one of the same name, and the job must not send into it."""
    try:
        st = os.lstat(folder)
    except OSError as exc:
        return f"{folder} cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{folder} is a link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if st.st_uid != os.geteuid():
        return f"{folder} was made by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o077:
        return f"{folder} is open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_path(path: str | None) -> bool:
    """Whether the hooks may use `path` (its folder is private to this user)."""
    if not path:
        return False
    return folder_problem(os.path.dirname(path) or ".") is None


def read_request(path: str, limit: int = 16) -> str | None:
    """The text of a request file in a private folder, then deleted; None when there is
    none, or when it is not a regular file of this user (a link or a FIFO is never
    followed or waited on)."""
    if not private_path(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        text = os.read(fd, limit).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        os.unlink(path)
    except OSError:
        return None
    return text


def write_request(path: str, text: str) -> bool:
    """Put a request file (the agent asking for a capture) at `path` in a private folder:
    written at a random name with O_EXCL|O_NOFOLLOW, then renamed (a planted link is
    replaced, never followed). False when it could not be."""
    if not private_path(path):
        return False
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, text.encode("ascii"))
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        return True
    except OSError:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
