"""End to end: the files gpudiag reads go through one bounded reader: never from a device or a fifo,
never another user's dump or segment, a recording's lines bounded before they are parsed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag.probes.stacks.pyspy_output import SourceLines
from tests.agent.test_write_targets import FIXTURE, NOBODY, root_only


@pytest.fixture
def open_dir():
    """A 0755 folder every user can reach (pytest's tmp_path sits in root's 0700 folder, and
    a job's files are read with the job's own rights)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gpudiag-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@root_only
def test_a_source_file_the_job_could_not_read_is_not_copied(open_dir):
    """As root, a frame naming a root-only file copied it into the recording."""
    tmp_path = open_dir
    secret = tmp_path / "shadow.py"
    secret.write_text("root_password = 'hunter2'\n")
    secret.chmod(0o600)
    job = subprocess.Popen(
        ["sleep", "30"],
        preexec_fn=lambda: (os.setgid(NOBODY), os.setuid(NOBODY)),
    )
    try:
        time.sleep(0.3)
        assert SourceLines().line(job.pid, f"f ({secret}:1)") == ""
        secret.chmod(0o644)
        assert SourceLines().line(job.pid, f"f ({secret}:1)") == "root_password = 'hunter2'"
    finally:
        job.kill()
        job.wait()


# ---- files a job names are read as the job ---------------------------
@root_only
def test_a_source_file_inside_a_folder_the_job_cannot_search_is_not_copied(open_dir):
    """X02: a 0644 file inside another user's 0700 home was copied into root's recording."""
    home = open_dir / "victim"
    home.mkdir(mode=0o700)
    notes = home / "notes.py"
    notes.write_text("VICTIM_SECRET = 1\n")
    notes.chmod(0o644)
    job = subprocess.Popen(
        ["sleep", "30"], preexec_fn=lambda: (os.setgid(NOBODY), os.setuid(NOBODY))
    )
    try:
        time.sleep(0.3)
        assert SourceLines().line(job.pid, f"f ({notes}:1)") == ""
        home.chmod(0o711)  # the job's user may search the folder now: the file is theirs to read
        assert SourceLines().line(job.pid, f"f ({notes}:1)") == "VICTIM_SECRET = 1"
    finally:
        job.kill()
        job.wait()


def test_procfs_files_are_never_read_as_source(tmp_path):
    """X02: a frame naming /proc/self/maps (0444) copied a line of root's memory map."""
    src = SourceLines()
    assert src.line(os.getpid(), "f (/proc/self/maps:1)") == ""
    assert src.line(os.getpid(), "f (/proc/self/status:1)") == ""
    ok = tmp_path / "ok.py"
    ok.write_text("x = 1\n")
    assert src.line(os.getpid(), f"f ({ok}:1)") == "x = 1"


def test_a_tty_named_as_source_never_becomes_the_controlling_terminal():
    """X01: a frame naming /dev/pts/N made a session leader without a terminal take the
    attacker's pty as its controlling terminal (then one ^\\ killed root's daemon)."""
    code = (
        "import os, sys\n"
        "from gpudiag.probes.stacks.pyspy_output import SourceLines\n"
        "m, s = os.openpty(); name = os.ttyname(s); os.close(s)\n"
        "line = SourceLines().line(os.getpid(), f'f ({name}:1)')\n"
        "try:\n"
        "    os.close(os.open('/dev/tty', os.O_RDWR)); print('TTY')\n"
        "except OSError:\n"
        "    print('NO-TTY')\n"
        "print(repr(line))\n"
    )
    res = subprocess.run(  # a session leader with no terminal, as under systemd
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["NO-TTY", "''"], res.stdout + res.stderr


def test_a_link_to_stdout_redirected_to_a_file_is_written_through(tmp_path):
    """N53: with stdout redirected to a file, `--out /dev/stdout` (here a root-made copy of
    that link) was replaced by a 0600 file holding the report, and the file stayed empty."""
    link = tmp_path / "mystdout"
    link.symlink_to("/proc/self/fd/1")
    redirected = tmp_path / "redirected.json"
    with open(redirected, "wb") as f:
        res = subprocess.run(
            [sys.executable, "-m", "gpudiag.agent.cli.main", "replay", str(FIXTURE)]
            + ["--out", str(link)],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert res.returncode in (0, 1), res.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    assert b'"schema_version"' in redirected.read_bytes()
