"""The files gpudiag writes go through one writer: a link, a fifo or a device planted where
an output goes is replaced, refused or written through, never followed into another file."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from gpudiag.agent.base import safeio
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import WriteError, append_text, atomic_write, create_stream
from gpudiag.agent.session.joboutput import StderrTee

FIXTURE = Path(__file__).parents[1] / "fixtures" / "h100" / "ckpt.jsonl.gz"

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs a second user (root only)")

NOBODY = 65534


def finishes(fn, timeout: float = 5.0):
    """fn() run on a thread: its result, or a failure when it is still blocked."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} blocked for {timeout} s"
    return box[0]


def test_job_log_is_private_redacted_and_replaces_a_planted_link(tmp_path):
    """`run --tui` appended the job's output to REPORT.job.log with open(path, 'ab'): a link
    planted there was followed as root; the log was 0644 and unredacted."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    log = tmp_path / "r.job.log"
    log.symlink_to(victim)
    r, w = os.pipe()
    old = os.umask(0o022)
    try:
        tee = StderrTee(r, str(log), keeper=False)  # no process in the fast tier
    finally:
        os.umask(old)
    os.write(w, b"HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz \x1b]0;pwned\x07title\nloss 1.0\n")
    os.close(w)
    time.sleep(0.5)
    panel = tee.take_lines()
    tee.close()
    assert victim.read_text() == "precious" and not log.is_symlink()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    text = log.read_text()
    assert "hf_abcdef" not in text and "***" in text and "loss 1.0" in text
    assert panel[0].startswith("HF_TOKEN=***") and "\x1b" not in "".join(panel)


def test_try_out_replaces_a_planted_link(tmp_path, monkeypatch):
    """`try --fix ... --out F` wrote with open(F, 'w'): a planted link was followed."""
    from gpudiag.agent.commands import tryfix
    from gpudiag.agent.session import trial

    monkeypatch.setattr(trial, "try_fix", lambda plan, th: {"verdict": "held", "change": "x"})
    monkeypatch.setattr("gpudiag.text.trials.summary_line", lambda t: "tried")
    victim, out = tmp_path / "victim", tmp_path / "try.json"
    victim.write_text("precious")
    out.symlink_to(victim)
    args = tryfix.TryOptions(
        cmd=("--", "python", "x.py"),
        fix=("dataloader:num_workers=2",),
        rounds=1,
        seconds=1.0,
        warmup=1.0,
        out=str(out),
    )
    assert tryfix.main(args) == 0
    assert victim.read_text() == "precious" and not out.is_symlink()
    assert json.loads(out.read_text())["trials"][0]["verdict"] == "held"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_step_summary_never_hangs_on_a_fifo_nor_follows_a_link(tmp_path, monkeypatch, capsys):
    """GITHUB_STEP_SUMMARY naming a FIFO hung the gate (open(summary, 'a'))."""
    from gpudiag.agent.commands.gate_output import github_outputs

    fifo = tmp_path / "summary"
    os.mkfifo(fifo)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(fifo))
    try:
        finishes(lambda: github_outputs("pass", [], "a note"))
    finally:  # unblock an old writer stuck in open()
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
    assert "step summary" in capsys.readouterr().err
    victim, link = tmp_path / "victim", tmp_path / "link"
    victim.write_text("precious")
    link.symlink_to(victim)
    with pytest.raises(WriteError):
        append_text(link, "x")
    assert victim.read_text() == "precious"
    append_text(tmp_path / "new.md", "a\n")
    append_text(tmp_path / "new.md", "b\n")
    assert (tmp_path / "new.md").read_text() == "a\nb\n"


@pytest.mark.parametrize("how", ["atomic_write", "create_stream"])
def test_a_link_to_a_device_is_written_through_never_replaced(tmp_path, how):
    """As root, `--out /dev/stdout` renamed a regular file over the system's /dev/stdout
    link: a link root or we made to a device is written into, never replaced."""
    out = tmp_path / "stdout"
    out.symlink_to("/dev/null")
    if how == "atomic_write":
        atomic_write(out, "report\n")
    else:
        with create_stream(out) as f:
            f.write(b"report\n")
    assert out.is_symlink() and os.readlink(out) == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@root_only
def test_a_fifo_another_user_planted_is_refused(tmp_path):
    """A FIFO another user made at the report's name would receive the 0600 report."""
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    os.chown(fifo, NOBODY, NOBODY)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(WriteError, match="another user"):
            atomic_write(fifo, "secret report")
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)


def test_outputs_naming_one_file_are_a_usage_error(tmp_path, cli):
    """--out and --speedscope naming one path overwrote each other and both said written."""
    same = str(tmp_path / "x.json")
    res = cli("replay", str(FIXTURE), "--out", same, "--speedscope", same)
    assert res.returncode == 2, res.stderr
    assert "name the same file" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not os.path.exists(same)
    with pytest.raises(UsageError):
        safeio.check_distinct({"--out": same, "--record": str(tmp_path / "." / "x.json")})
    safeio.check_distinct({"--out": "/dev/null", "--speedscope": "/dev/null"})
