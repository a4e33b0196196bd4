"""Every file gpudiag writes goes through one atomic, private writer (issue 23 #2, #3, #8):
planted links are never followed, files are 0600 unless asked, a full disk names the file,
leaves nothing behind and does not change the job's exit code."""

from __future__ import annotations

import contextlib
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.agent.base import safeio
from gpudiag.agent.base.config import load_settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.gate import write_baseline
from gpudiag.agent.commands.replay import replay_report
from gpudiag.agent.output.exports import write_exports, write_json, write_text
from gpudiag.agent.output.recording import Recorder
from gpudiag.agent.output.report import write_report
from tests.agent.test_cli_errors import assert_one_line_error
from tests.conftest import gpudiag

FIXTURE = Path(__file__).parents[1] / "fixtures" / "h100" / "ckpt.jsonl.gz"


@pytest.fixture(scope="module")
def doc() -> dict:
    return replay_report(str(FIXTURE), load_settings(None))


WRITERS = {
    "json export": lambda d, p: write_json({"a": 1}, p),
    "text export": lambda d, p: write_text("hello\n", p),
    "report": lambda d, p: write_report(d, p),
    "baseline": lambda d, p: write_baseline(p, [{"steps_per_s": 1.0}], {}),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_planted_links_are_never_followed(tmp_path, doc, writer):
    """Issue 23 #2: `{path}.tmp-{pid}` was opened with a plain open(): a link planted there
    made a root gpudiag overwrite any file."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out.json"
    for name in (f"{out}.tmp-{os.getpid()}", f"{out}.tmp"):
        os.symlink(victim, name)
    WRITERS[writer](doc, str(out))
    assert victim.read_text() == "precious"
    assert out.is_file() and not out.is_symlink() and out.stat().st_size > 0
    # the target itself a link to the victim: the link is replaced, the victim untouched
    out.unlink()
    out.symlink_to(victim)
    WRITERS[writer](doc, str(out))
    assert victim.read_text() == "precious" and not out.is_symlink()
    leftovers = {p.name for p in tmp_path.iterdir()} - {"victim", "out.json"}
    assert all(os.path.islink(tmp_path / n) for n in leftovers), leftovers  # only the plants


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_files_are_private_unless_asked(tmp_path, doc, writer, monkeypatch):
    """Issue 23 #3: reports, recordings and exports hold command lines and stacks: 0600;
    0644 only when GPUDIAG_FILE_MODE asks."""
    old = os.umask(0o022)
    try:
        out = tmp_path / "a.json"
        WRITERS[writer](doc, str(out))
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
        monkeypatch.setenv("GPUDIAG_FILE_MODE", "0644")
        WRITERS[writer](doc, str(out))
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        monkeypatch.setenv("GPUDIAG_FILE_MODE", "777")
        with pytest.raises(UsageError, match="GPUDIAG_FILE_MODE"):
            WRITERS[writer](doc, str(out))
    finally:
        os.umask(old)


def test_recording_is_private_and_replaces_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "r.jsonl.gz"
    path.symlink_to(victim)
    rec = Recorder(str(path), {"run": {"command": ["x"], "pid": 1}})
    rec.close({"probes": [], "errors": []})
    assert victim.read_text() == "precious" and not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_full_disk_during_exports_names_the_file_and_leaves_nothing(tmp_path, doc, monkeypatch):
    """Issue 23 #8: an internal error that left `*.tmp-PID` behind."""

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safeio.os, "write", full)
    trace, prof = tmp_path / "t.json", tmp_path / "s.json"
    lines = write_exports(doc, str(prof), str(trace))
    assert lines == [
        f"no speedscope profile: cannot write speedscope profile {prof}: No space left on device",
        f"no Chrome/Perfetto trace: cannot write Chrome/Perfetto trace {trace}: "
        "No space left on device",
    ]
    assert list(tmp_path.iterdir()) == []


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


def test_a_device_target_is_written_in_place_never_renamed_over():
    """As root a rename over /dev/null would replace the device node for the whole box."""
    write_text("x\n", "/dev/null")
    safeio.create_stream("/dev/null", "recording").close()
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
