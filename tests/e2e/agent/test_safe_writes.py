"""End to end: every file gpudiag writes goes through one atomic, private writer (issue 23 #2, #3,
#8): planted links are never followed, files are 0600 unless asked, a full disk names the file,
leaves nothing behind and does not change the job's exit code."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.agent.output.report import write_report
from tests.agent import test_safe_writes as unit
from tests.conftest import assert_one_line_error, gpudiag

doc = unit.doc  # its fixture: a report replayed from a recorded H100 run


def _fsize_cap(limit: int):
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return cap


def test_report_out_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, doc):
    """The file-size limit stands in for a full disk (EFBIG instead of ENOSPC)."""
    src = tmp_path / "in.json"
    write_report(doc, src)
    folder = tmp_path / "out"
    folder.mkdir()
    res = gpudiag(
        "report",
        str(src),
        "--format",
        "json",
        "--out",
        str(folder / "r.json"),
        preexec_fn=_fsize_cap(2048),
    )
    assert_one_line_error(res, f"cannot write json report {folder / 'r.json'}")
    assert list(folder.iterdir()) == []


@contextlib.contextmanager
def _full_tmpfs(tmp_path: Path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
        ).returncode
    ):
        pytest.skip("needs root and tmpfs to make a full disk")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_run_keeps_the_jobs_exit_code_when_an_export_hits_a_full_disk(tmp_path):
    """Issue 23 #8: under `run`, a failed export turned the job's exit 0 into 2."""
    with _full_tmpfs(tmp_path) as full:
        res = gpudiag(
            "run",
            "--out",
            str(tmp_path / "r.json"),
            "--trace",
            str(full / "t.json"),
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(1.5)",
            timeout=180,
        )
        assert res.returncode == 0, res.stderr
        assert f"cannot write Chrome/Perfetto trace {full / 't.json'}" in res.stdout + res.stderr
        assert "internal error" not in res.stderr
        assert sorted(p.name for p in full.iterdir()) == ["filler"]
    assert (tmp_path / "r.json").is_file()


def test_a_bad_file_mode_is_refused_before_anything_runs(tmp_path):
    res = gpudiag(
        "run",
        "--out",
        str(tmp_path / "r.json"),
        "--",
        sys.executable,
        "-c",
        "pass",
        env=dict(os.environ, GPUDIAG_FILE_MODE="0777"),
    )
    assert_one_line_error(res, "GPUDIAG_FILE_MODE='0777'")
    assert list(tmp_path.iterdir()) == []
