"""Every file gpudiag writes goes through one atomic, private writer (issue 23 #2, #3, #8):
planted links are never followed, files are 0600 unless asked, a full disk names the file,
leaves nothing behind and does not change the job's exit code."""

from __future__ import annotations

import os
import stat
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


def test_a_device_target_is_written_in_place_never_renamed_over():
    """As root a rename over /dev/null would replace the device node for the whole box."""
    write_text("x\n", "/dev/null")
    safeio.create_stream("/dev/null", "recording").close()
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
