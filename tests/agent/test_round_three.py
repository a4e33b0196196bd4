"""Issue 38, hardening round three: the attacks that went around last round's fixes, each
held at its boundary's choke point (the walking tests are in tests/test_choke_points.py)."""

from __future__ import annotations

import gzip
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudiag.agent.base import safeio
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import WriteError, append_text, atomic_write, create_stream
from gpudiag.agent.output import recording
from gpudiag.agent.session.joboutput import StderrTee
from gpudiag.probes.dist.flight_recorder import read_dumps
from gpudiag.probes.stacks.pyspy_output import SourceLines

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


# ---- files written: one writer ------------------------------------------------------------
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
        tee = StderrTee(r, str(log))
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


# ---- files read: one bounded reader -------------------------------------------------------
def test_stack_source_lines_are_never_read_from_a_device_or_fifo(tmp_path):
    """A frame naming /dev/zero made root's attach read forever; a FIFO blinded the probe."""
    fifo = tmp_path / "src.py"
    os.mkfifo(fifo)
    src = SourceLines()
    assert finishes(lambda: src.line(os.getpid(), "f (/dev/zero:1)")) == ""
    assert finishes(lambda: src.line(os.getpid(), f"f ({fifo}:1)")) == ""
    ok = tmp_path / "ok.py"
    ok.write_text("import torch\nx = 1\n")
    assert src.line(os.getpid(), f"f ({ok}:2)") == "x = 1"


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


def test_flight_recorder_never_waits_on_a_fifo(tmp_path):
    """A FIFO at the default /tmp/nccl_trace_rank_0 hung every distributed run's report."""
    prefix = str(tmp_path / "nccl_trace_rank_")
    os.mkfifo(prefix + "0")
    assert finishes(lambda: read_dumps(prefix, [0])) == {}


@root_only
def test_flight_recorder_dumps_of_another_user_are_ignored(tmp_path):
    """Two small planted dumps gave a healthy DDP job a false DIST002."""
    from tests.probes.test_flight_recorder import entry, write_dumps

    prefix = write_dumps(tmp_path, {0: [entry(3, "started")]}, as_json=True)
    assert read_dumps(prefix, [0]) != {}  # our own dump is read
    os.chown(prefix + "0", NOBODY, NOBODY)
    assert read_dumps(prefix, [0]) == {}
    assert read_dumps(prefix, [0], owners={NOBODY}) != {}  # the ranks' own user's is read


def _gz(path: Path, lines: list[bytes]) -> str:
    with gzip.open(path, "wb") as f:
        f.write(b"".join(lines))
    return str(path)


def test_recording_empty_line_flood_is_refused_in_bounded_time(tmp_path):
    """200 MB of empty lines in a 204 KB file replayed for 257 s."""
    header = json.dumps({"format": "gpudiag-recording", "version": 2}).encode() + b"\n"
    path = _gz(tmp_path / "r.jsonl.gz", [header, b"\n" * (recording.MAX_BLANK_LINES + 10)])
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="empty lines"):
        list(recording.iter_lines(path))
    assert time.monotonic() - t0 < 5


def test_recording_line_items_are_bounded_before_parsing(tmp_path, monkeypatch):
    """One 60 MiB `[{},{},...]` line took 3.1 GB: items are counted before json parses."""
    monkeypatch.setattr(recording, "MAX_LINE_ITEMS", 1000)
    line = b'{"x":[' + b",".join([b"{}"] * 2000) + b"]}\n"
    path = _gz(tmp_path / "r.jsonl.gz", [line])
    parsed = []
    monkeypatch.setattr(recording, "parse_json", lambda *a, **k: parsed.append(1))
    with pytest.raises(UsageError, match="more than 1000 items"):
        list(recording.iter_lines(path))
    assert parsed == []


@root_only
def test_an_older_segment_of_another_user_is_not_merged(tmp_path):
    """A planted FILE.1 with the right header was merged into another user's replay."""
    import shutil

    rec = tmp_path / "r.jsonl.gz"
    shutil.copy(FIXTURE, rec)
    header = next(recording.iter_lines(str(rec)))
    header.update(segment=1, recording_id="abc")
    older = dict(header, segment=0)
    _gz(rec, [json.dumps(header).encode() + b"\n"])
    _gz(Path(str(rec) + ".1"), [json.dumps(older).encode() + b"\n"])
    assert recording.open_recording(str(rec)).previous == str(rec) + ".1"
    os.chown(str(rec) + ".1", NOBODY, NOBODY)
    assert recording.open_recording(str(rec)).previous is None


# ---- processes: try kills only what it launched --------------------------------------------
def test_try_ends_the_job_it_launched_not_the_pid_a_report_names(tmp_path, monkeypatch):
    """`try` re-read the report it wrote and killed the PID it named: in a shared folder
    another user chose which process root killed."""
    from gpudiag.agent.base.config import load_settings
    from gpudiag.agent.commands import run, tryfix
    from gpudiag.agent.commands.replay import replay_report
    from gpudiag.agent.output.report import write_report

    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    victim, job = subprocess.Popen(sleep), subprocess.Popen(sleep)
    doc = replay_report(str(FIXTURE), load_settings(None))
    doc["run"]["pid"] = victim.pid  # what a planted or rewritten report names

    def fake_run(opts, on_launch, on_report):
        on_launch(job.pid)
        write_report(doc, opts.out)
        on_report(doc)  # run hands try the report as computed
        return 0

    monkeypatch.setattr(run, "main", fake_run)
    args = tryfix.TryOptions(out=str(tmp_path / "d.json"), diagnose_seconds=1.0)
    try:
        tryfix.diagnose_first(["python", "x.py"], args)
        assert job.wait(timeout=15) is not None
        assert victim.poll() is None, "the PID the report named was killed"
    finally:
        for p in (victim, job):
            p.kill()
            p.wait()


# ---- numbers: one parser that refuses non-finite values ------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        'fail = "nan%"',
        'fail = "NaN %"',
        'warn = "inf%"',
        'fail = "-Infinity%"',
        'fail = "1e400%"',
        'fail = "nan"',
    ],
)
def test_gate_limits_refuse_non_finite_in_any_spelling(tmp_path, line):
    """`fail = "nan%"` passed a -90% regression."""
    from gpudiag.agent.commands.gate import load_gate_config

    cfg = tmp_path / "gate.toml"
    cfg.write_text(f"[gate.metrics.steps_per_second]\n{line}\n")
    with pytest.raises(UsageError, match="finite|percentage"):
        load_gate_config(str(cfg))


@pytest.mark.parametrize("value", ['"inf"', '"nan"', '"-inf"', '"1e999"', "true"])
def test_gate_min_effect_refuses_non_finite(tmp_path, value):
    """`min_effect = "inf"` made nothing fail."""
    from gpudiag.agent.commands.gate import load_gate_config

    cfg = tmp_path / "gate.toml"
    cfg.write_text(f"[gate]\nmin_effect = {value}\n")
    with pytest.raises(UsageError, match="min_effect"):
        load_gate_config(str(cfg))


BAD_DATAGRAMS = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"steps": [[1e400, 1, 1, 1, 1, 1, 1, 1, 1]]}',
    b'{"steps": [[NaN, 1, 1, 1, 1, 1, 1, 1, 1]]}',
    b'{"steps": [[1.0, 1e400, 1, 1, 1, 1, 1, 1, 1]]}',
    b'{"steps": [[1.0, ' + b"9" * 400 + b", 1, 1, 1, 1, 1, 1, 1]]}",
    b'{"mem": {"allocated": ' + b"9" * 400 + b"}}",
    b'{"sites": {"a": ' + b"9" * 400 + b"}}",
    b'{"pid": 7, "dist": {"env": {"rank": "\xc2\xb2"}, "steps": [[1e300, 1, 1, 1]]}}',
    b'{"pid": 7, "dist": {"t": 1e300, "ops": {"x": [1, 2]}}}',
    b'{"capture": {"t0": 1e400, "steps": []}}',
    b'{"capture": {"steps": [' + b"[" * 5000 + b"]" * 5000 + b"]}}",
]


@pytest.mark.parametrize("data", BAD_DATAGRAMS, ids=range(len(BAD_DATAGRAMS)))
def test_datagram_parser_never_raises(data):
    """The hooks' parser raised on deep nesting, 1e400/NaN times or a rank '²'."""
    from gpudiag.probes.dist.collectives import RankLabels
    from gpudiag.probes.inprocess.channel import decode_datagram, parse_message

    labels = RankLabels()
    labels.enabled = True
    msg = decode_datagram(data)
    if msg is not None:
        for s in labels.tag(msg, parse_message(msg)):
            assert all(v == v and abs(v) != float("inf") for v in s.values.values())


def test_one_bad_datagram_does_not_stop_the_hooks_probe(tmp_path):
    """One bad datagram raised out of sample(): the hooks probe stopped for the run."""
    import socket

    from gpudiag.probes.base import Target
    from gpudiag.probes.inprocess.channel import HookProbe

    probe = HookProbe(str(tmp_path / "ch.sock"))
    assert probe.open(Target(os.getpid())).available
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        good = b'{"sites": {"x.py:1": 3}}'
        for data in (good, b'{"pid": 1, "dist": {"env": {"rank": "\xc2\xb2"}}}', good):
            s.sendto(data, probe.path)
        probe.labels.enabled = True
        got = probe.sample()
        assert [x.labels.get("kind") for x in got] == ["sync_site", "sync_site"]
    finally:
        probe.close()


# ---- text that leaves gpudiag: redacted, escaped for its format ----------------------------
@pytest.mark.parametrize(
    "text, secret",
    [
        ('{"api_key": "abc123xyz"}', "abc123xyz"),
        ("['--token', 'abc123xyz']", "abc123xyz"),
        ("password = abc123xyz", "abc123xyz"),
        ("Bearer abc123xyz", "abc123xyz"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N", "dozjgNryP4J3j"),
        ("key sk_live_abcdefghijklmnop1234", "abcdefghijklmnop"),
        ("AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", "abcdefghijklmnop"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEabc123xyz\n-----END RSA PRIVATE KEY-----", "MIIE"),
        ("connect admin:abc123xyz@db.internal:5432", "abc123xyz"),
        ("mysql -u root -pabc123xyz db", "abc123xyz"),
    ],
)
def test_round_three_secret_shapes_are_hidden(text, secret):
    from gpudiag.text.redact import redact_argv, redact_lines, redact_text

    assert secret not in redact_text(text)
    assert secret not in " ".join(redact_argv(["prog", text]) or [])
    assert secret not in " ".join(redact_lines(text.split("\n")) or [])


def test_harmless_text_is_left_alone():
    from gpudiag.text.redact import redact_argv, redact_text

    for text in ("loss = 0.5 max_tokens = 12", "train.py:12 in step", "-pthread -O2"):
        assert redact_text(text) == text
    assert redact_argv(["mysql", "-p", "abc"]) == ["mysql", "-p", "***"]
    assert redact_argv(["gcc", "-O2"]) == ["gcc", "-O2"]


def test_escapes_and_controls_are_stripped():
    """ESC/OSC sequences from the job's argv and output reached the terminal raw; a newline
    in argv forged log lines."""
    from gpudiag.text.redact import printable

    raw = "a\x1b]52;c;cHduZWQ=\x07b\x1b[2J\x1b[31mc\x9b1Jd\u202ee\nforged: line"
    out = printable(raw)
    assert "\x1b" not in out and "\x9b" not in out and "\u202e" not in out and "\n" not in out
    assert out.startswith("abcde forged") and printable("x\ny", lines=True) == "x\ny"


def test_junit_attributes_are_quote_escaped(tmp_path):
    """The JUnit `name` attribute was not quote-escaped."""
    import xml.etree.ElementTree as ET

    from gpudiag.agent.commands.gate_output import junit_xml
    from gpudiag.analyzers.stats.gate import Comparison

    name = 'm" injected="1\x01'
    c = Comparison(name, "fail", 1.0, 0.5, -0.5, -0.6, -0.4, 5, 5, 0.1, 'why "quoted"')
    path = tmp_path / "j.xml"
    junit_xml(str(path), [c], "note 'x'")
    case = ET.parse(path).getroot().find("testcase")
    assert case.get("name") == 'm" injected="1' and case.get("injected") is None


def test_gate_comparisons_are_escaped_in_html():
    """A report's gate.comparisons fields reached the HTML page unescaped and ran script."""
    from gpudiag.agent.output.render.html import _gate

    evil = "<script>alert(1)</script>"
    comp = {"metric": "m", "verdict": "fail", "baseline": evil, "current": 1.0}
    comp.update(delta=0.1, ci_low=evil, ci_high=0.2, n_baseline=evil, n_current=3)
    page = _gate({"gate": {"verdict": "fail", "comparisons": [comp]}})
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_markup_in_an_argv_does_not_crash_top():
    """A process argv holding `[/x]` crashed anyone's `gpudiag top` (Rich markup)."""
    import asyncio

    from gpudiag.tui.top import TopApp
    from tests.tui.test_top import NO_GPU, procs

    row = dict(procs([1])[0], command="python [/x] [bold]x --api-key abcdefghij \x1b[2J")
    app = TopApp(lambda: dict(NO_GPU, processes=[row]))

    async def go():
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.pause()
            shown = " ".join(str(c) for c in app.query_one("#procs").get_row_at(0))
            assert "[/x] [bold]x --api-key ***" in shown and "\x1b" not in shown
            await pilot.press("q")

    asyncio.run(go())


# ---- round 6 (issue 53): files a job names are read as the job ---------------------------
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
