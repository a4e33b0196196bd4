"""Issue 38, hardening round three, the rest: outbound text through one sink, frames that a
`;` cannot forge, bounded config regexes, signals around the launch, guards inside the job,
bounded fleet labels, and HOST002 against a saturated GPU. Each test failed on the code
before its fix."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from gpudiag.agent.output.report import write_report
from tests.conftest import gpudiag, gpudiag_until_sure
from tests.tui.test_app import starved_doc

EVIL = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\x9b31m"  # clipboard write, clear screen, C1 CSI
SECRET = "hf_abcdefghijklmnopqrstuvwx"


def _evil_doc() -> dict:
    doc = starved_doc()
    f = doc["findings"][0]
    f["location"] = f"train.py:12:load{EVIL}"
    f["message"] += f" {EVIL} token {SECRET}"
    f["title"] = "[/x] [bold]title"
    return doc


# ---- outbound text ----------------------------------------------------------------------------


def test_summary_and_markdown_never_carry_escapes_or_secrets(tmp_path, cli):
    """A frame's name or a job's text holding ESC/OSC reached the terminal raw through the
    text summary and markdown (`report`, and `report --out`, a file someone will `cat`)."""
    report = str(write_report(_evil_doc(), str(tmp_path / "r.json")))
    for fmt in ("text", "markdown"):
        res = cli("report", report, "--format", fmt)
        assert res.returncode == 0, res.stderr
        assert "load" in res.stdout and "[/x" in res.stdout.replace("\\", "")
        assert not any(c in res.stdout for c in "\x1b\x07\x9b") and SECRET not in res.stdout
        out = tmp_path / f"r.{fmt}"
        assert cli("report", report, "--format", fmt, "--out", str(out)).returncode == 0
        assert "\x1b" not in out.read_text() and SECRET not in out.read_text()


def test_a_newline_in_argv_cannot_forge_a_watch_log_line(capsys):
    """`watch` logged a job's command line raw: a newline in it forged a log line."""
    from gpudiag.agent.commands.watch import Watcher

    w = Watcher(settings=None, opts=None)  # type: ignore[arg-type]
    w.log(f"watching pid 7 (python x.py\ngpudiag: pid 1 ended; no longer watched{EVIL})")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpudiag: watching pid 7")
    assert "\x1b" not in err and "\x07" not in err


def test_the_sink_keeps_gpudiags_own_text(capsys, cli):
    """The sink hides secrets and escapes, not gpudiag's words: the settings listing, a
    summary's lines and a path pass unchanged."""
    from gpudiag.text.sink import emit, say

    res = cli("thresholds")
    assert res.returncode == 0 and "= " in res.stdout
    emit(res.stdout, end="")
    say("Report written to /tmp/a b/report.json  (details: gpudiag report x)")
    out = capsys.readouterr()
    assert out.out == res.stdout
    assert (
        out.err == "gpudiag: Report written to /tmp/a b/report.json  (details: gpudiag report x)\n"
    )


def test_markup_in_any_report_field_does_not_crash_report_tui():
    """A report title holding `[/x]` crashed `gpudiag report --tui` (Rich markup)."""
    from gpudiag.tui.app import DiagnosisApp
    from gpudiag.tui.feeds import static_feed
    from gpudiag.tui.screens import FindingScreen
    from gpudiag.tui.widgets import FindingsTable

    doc = _evil_doc()
    doc["run"]["pid"] = "[/pid]"
    app = DiagnosisApp(static_feed(doc, f"report [/file].json{EVIL}"))

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            row = " ".join(str(c) for c in app.screen.query_one(FindingsTable).get_row_at(0))
            assert "[/x] [bold]title" in row
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(app.screen, FindingScreen)
            await pilot.press("escape", "question_mark")
            await pilot.pause()
            await pilot.press("q")

    asyncio.run(go())
    json.dumps(doc)  # the document itself is untouched


# ---- a ';' in a frame's name ------------------------------------------------------------------


def _forged_stack(monkeypatch, frames: tuple[str, ...]) -> list[str]:
    """The findings of a run whose loop spends all its time in `frames`."""
    from gpudiag.analyzers import analyze
    from tests.analyzers import scenario
    from tests.analyzers.test_findings import ids, windows

    monkeypatch.setitem(scenario.STACKS, "forged", ";".join(frames))
    return ids(analyze(windows(scenario.Scenario(), shares={"forged": 1.0}).tl))


def test_a_semicolon_in_a_function_name_forges_no_frame(monkeypatch):
    """A job naming a function `train_step;save_checkpoint` (code.replace(co_name=...)) got a
    false CKPT001 at 100%: the stack label joins frames with ';'."""
    from gpudiag.probes.stacks.pyspy_output import parse_raw, parse_speedscope

    frames = [
        {"name": "<module>", "file": "/work/train.py", "line": 80},
        {"name": "train", "file": "/work/train.py", "line": 40},
        {"name": "train_step;save_checkpoint", "file": "/work/a;b.py", "line": 60},
    ]
    doc = {"shared": {"frames": frames}, "profiles": [{"name": "Thread 1", "samples": [[0, 1, 2]]}]}
    (row,), _ = parse_speedscope(doc, default_pid=1)
    assert len(row.frames) == 3 and ";" not in "".join(row.frames)
    assert "CKPT001" not in _forged_stack(monkeypatch, row.frames)
    # py-spy's raw (collapsed) lines: the piece before the ';' is not a frame of its own
    raw = "<module> (/work/train.py:80);train_step;save_checkpoint (/work/train.py:60) 5\n"
    (row,) = parse_raw([raw], default_pid=1)
    assert row.frames == (
        "<module> (/work/train.py:80)",
        "train_step；save_checkpoint (/work/train.py:60)",
    )
    assert "CKPT001" not in _forged_stack(monkeypatch, row.frames)
    # the check can fail: the frame as the old parser split it is a checkpoint save
    assert "CKPT001" in _forged_stack(
        monkeypatch, ("<module> (/w/t.py:1)", "save_checkpoint (/w/t.py:2)")
    )


# ---- rules from ./pyproject.toml --------------------------------------------------------------

FIXTURE = "tests/fixtures/h100/ckpt.jsonl.gz"


def _rules_file(tmp_path, rule: str) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.gpudiag]\n[[tool.gpudiag.rules]]\ncategory = "data_wait"\n{rule}\n'
    )


def _replay_with_rules(tmp_path, rule: str, timeout: float = 60):
    """In a process of its own: a catastrophic pattern that slipped through would hang it,
    and the timeout ends it."""
    _rules_file(tmp_path, rule)
    fixture = Path(__file__).parents[2] / FIXTURE
    return gpudiag("replay", str(fixture), cwd=tmp_path, timeout=timeout)


def test_catastrophic_rule_patterns_are_refused_in_one_line(tmp_path):
    """`[[tool.gpudiag.rules]]` read from ./pyproject.toml without being named compiled
    `(a+)+b` and the like, which hang run, attach and replay on a long frame name."""
    for pattern in (
        r"(a+)+$",
        r"(a|aa)*$",
        r"\w*\w*\w*\w*!",
        r"(.*a){12}",
        r"(a)\1",
        "a" * 201,
    ):
        res = _replay_with_rules(tmp_path, f"function = '{pattern}'", timeout=30)
        assert res.returncode == 2, (pattern, res.stderr)
        assert res.stderr.count("\n") == 1 and "rule 1: function" in res.stderr, res.stderr


def test_wrongly_typed_rule_fields_are_a_usage_error(tmp_path, cli, monkeypatch):
    """`function = 5` gave 'internal error' (a TypeError from re)."""
    monkeypatch.chdir(tmp_path)  # in-process (refused before any replay): ./pyproject.toml
    fixture = str(Path(__file__).parents[2] / FIXTURE)
    for rule in ("function = 5", 'file = ["x"]', 'function = "x"\ndescription = 5'):
        _rules_file(tmp_path, rule)
        res = cli("replay", fixture)
        assert res.returncode == 2 and "internal error" not in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1 and "rule 1:" in res.stderr


def _implicit(tmp_path, mode: int, uid: int | None = None):
    import os

    from gpudiag.agent.base.config import load_settings

    pp = tmp_path / "pyproject.toml"
    pp.write_text("[tool.gpudiag.thresholds]\ndata_wait_warn = 0.9\n")
    pp.chmod(mode)
    if uid is not None:
        os.chown(pp, uid, -1)
    return load_settings(None, cwd=tmp_path)


def test_an_implicit_pyproject_others_may_write_is_ignored_in_one_line(tmp_path, capsys):
    """./pyproject.toml is read without being named: group- or world-writable, anyone could
    have set its thresholds and rules (a user's own, 0644, is read)."""
    assert _implicit(tmp_path, 0o644).thresholds.data_wait_warn == 0.9
    for mode, who in ((0o664, "its group"), (0o646, "others")):
        s = _implicit(tmp_path, mode)
        assert s.source is None and s.thresholds.data_wait_warn != 0.9
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"writable by {who}" in err and "ignoring" in err


def test_an_implicit_pyproject_of_another_user_is_ignored(tmp_path, capsys, monkeypatch):
    """Another user's ./pyproject.toml (a shared folder) is not read; root's is."""
    import os

    if os.geteuid() == 0:
        s = _implicit(tmp_path, 0o644, uid=4321)
    else:  # the file is ours: look at it as another, non-root user
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
        s = _implicit(tmp_path, 0o644)
    assert s.source is None and s.thresholds.data_wait_warn != 0.9
    assert "belongs to another user" in capsys.readouterr().err


def test_a_users_rule_is_matched_in_bounded_time():
    """What a rule that is allowed can still cost: two quantifiers over a huge frame name."""
    import threading
    import time

    from gpudiag.analyzers.measures.rules import parse_stack, rules_from_config

    ok = [r"save_ckpt$", r"torch/utils/data/.*\.py$", r"\w+\.\w+", r".*a.*b"]
    rules = rules_from_config([{"category": "data_wait", "function": p} for p in ok])
    stack = parse_stack("a" * 20_000 + " (/w/t.py:1)")
    box: list[bool] = []
    worker = threading.Thread(target=lambda: box.append(rules[-1].matches(stack, "")), daemon=True)
    t0 = time.perf_counter()
    worker.start()
    worker.join(10)  # unbounded, this ran for hours (a daemon thread: the test ends anyway)
    assert box == [False] and time.perf_counter() - t0 < 2.0


def test_a_lone_surrogate_in_a_report_is_one_line(tmp_path):
    """A report field holding "\\ud800" (valid JSON) gave 'internal error' on output."""
    doc = starved_doc()
    doc["findings"][0]["message"] = "x \ud800 y"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    res = gpudiag("report", str(path))
    assert res.returncode == 2 and "lone surrogate" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1
    capsys_free = emit_to_string("watching pid 1 (x \udcff.py)")
    assert "\ufffd" in capsys_free


def emit_to_string(text: str) -> str:
    import io

    from gpudiag.text.sink import emit

    buf = io.StringIO()
    emit(text, file=buf)
    return buf.getvalue()


# ---- signals ----------------------------------------------------------------------------------


class _Killed(Exception):
    """Stands for SIGTERM's default action (gpudiag killed) in an in-process test."""


def test_a_sigterm_while_run_starts_the_job_still_gets_the_report(tmp_path, monkeypatch):
    """A SIGTERM after `run` started the job and before its handlers were installed killed
    gpudiag with no report and orphaned the job."""
    import os
    import signal
    import sys

    from gpudiag.agent.cli.main import main
    from gpudiag.agent.commands import run as run_mod

    real_launch = run_mod.launch

    def launch_then_term(*a, **kw):
        job = real_launch(*a, **kw)
        started.append(job.popen)
        os.kill(os.getpid(), signal.SIGTERM)  # in the window between the two
        return job

    def killed(signum, frame):
        raise _Killed()

    started: list = []
    monkeypatch.setattr(run_mod, "launch", launch_then_term)
    old = signal.signal(signal.SIGTERM, killed)
    out = tmp_path / "r.json"
    try:
        rc = main(["run", "-q", "--no-inject", "--out", str(out), "--", sys.executable, "-c",
                   "import time; time.sleep(60)"])  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, old)
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert rc == 128 + signal.SIGTERM  # the job got the SIGTERM too: its status passed through
    assert started[0].returncode == -signal.SIGTERM
    assert json.loads(out.read_text())["run"]["end_reason"] in ("interrupted", "target_exited")


def test_a_job_dead_before_the_last_look_is_reaped_and_reported():
    """A SIGKILLed job seen dead by its pid before poll() reaped it gave exit 0 and no error."""
    import os
    import signal
    import subprocess
    import sys

    from gpudiag.agent.base.config import load_settings
    from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
    from gpudiag.probes.base import Target

    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(popen.pid, signal.SIGKILL)
    os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped

    class LatePoll:  # poll() ran just before the job died
        pid = popen.pid

        def poll(self):
            return None

        def wait(self, timeout=None):
            return popen.wait(timeout)

    parts = SessionParts(probes=[], popen=LatePoll(), log=lambda m: None)
    s = Session(Target(popen.pid), load_settings(None, cwd=Path("/")), SessionOptions(), parts)
    assert not s.target_alive()
    assert s.exit_code == -signal.SIGKILL
    assert any("killed by SIGKILL" in e["message"] for e in s.errors)


def test_gate_stops_on_sigterm_and_writes_no_baseline(tmp_path):
    """`gate` kept going after SIGTERM (each run's session took it as the end of that run)
    and wrote its baseline."""
    import signal
    import subprocess
    import sys
    import time

    marker, base = tmp_path / "started", tmp_path / "base.json"
    job = f"import time; open({str(marker)!r}, 'a').write('x'); time.sleep(30)"
    cmd = [sys.executable, "-m", "gpudiag.agent.cli.main", "gate", "--baseline", str(base)]
    cmd += ["--update-baseline", "--runs", "3", "--duration", "20", "--", sys.executable, "-c", job]
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the session is sampling the first run
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and not base.exists()
    assert marker.read_text() == "x"  # no second run was started


# ---- budget and fleet -------------------------------------------------------------------------


def test_job_labels_from_the_jobs_environment_are_bounded():
    """A 5,000-character POD_NAME (or one holding escapes) went into every metric's labels."""
    from gpudiag.agent.fleet.identity import identity_from

    env = {
        "POD_NAME": "p" * 5000,
        "POD_NAMESPACE": "ns\x1b]0;x\x07\nfake",
        "SLURM_JOB_ID": "9" * 999,
    }
    ids = identity_from(1, ["python", "x" * 9000], "", env, "u", "h")
    assert len(ids["pod"]) <= 253 and len(ids["slurm_job_id"]) <= 253
    assert ids["namespace"] == "ns fake" and len(ids["command"]) <= 1024


def test_the_ptrace_hint_never_recommends_setcap():
    """`setcap cap_sys_ptrace+ep` on py-spy lets every local user read root's processes."""
    from gpudiag.probes.stacks.pyspy import PTRACE_HINT, diagnose_py_spy_error

    _, hint = diagnose_py_spy_error("Permission denied (os error 13)", 1)
    assert "setcap" not in PTRACE_HINT and "setcap" not in (hint or "")
    assert "ptrace_scope" in PTRACE_HINT


# ---- inside the job ---------------------------------------------------------------------------


def _job(script: str, tmp_path, env: dict | None = None, under_run: bool = False):
    """Run `script` as a job (under `gpudiag run` when `under_run`); its completed process."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **(env or {})}
    cmd = [sys.executable, "-c", script]
    if under_run:
        out = str(tmp_path / "r.json")
        return gpudiag("run", "-q", "--out", out, "--", *cmd, env=env, cwd=tmp_path, timeout=180)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_instrument_never_breaks_the_job(tmp_path):
    """instrument() -> _install and the CUDA install were unguarded: a torch that does not
    look as the hooks expect raised into the user's script."""
    breaks = {
        "optimizer hook": "import torch.optim.optimizer as o\n"
        "del o.register_optimizer_step_post_hook",
        "cuda": "torch.cuda.is_available = lambda: True; del torch.cuda.synchronize",
    }
    for what, broken in breaks.items():
        script = (
            f"import torch\n{broken}\n"
            "from gpudiag.probes.hooks import instrument\ninstrument()\nprint('job ran')\n"
        )
        res = _job(script, tmp_path)
        assert res.returncode == 0 and "job ran" in res.stdout, (what, res.stderr)
        assert "not installed" in res.stderr


def test_a_nested_tensor_batch_does_not_crash_the_job(tmp_path):
    """The DataLoader wrapper read `.shape` unguarded: a nested-tensor loader crashed on its
    first batch under the default hooks."""
    script = (
        "import torch, warnings\nwarnings.simplefilter('ignore')\n"
        "from gpudiag.probes.hooks import instrument\ninstrument()\n"
        "nt = lambda b: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])\n"
        "odd = type('Odd', (), {'shape': property(lambda s: 1 / 0)})\n"
        "for collate in (nt, lambda b: {'x': odd()}, lambda b: [odd()]):\n"
        "    loader = torch.utils.data.DataLoader(range(4), batch_size=2, collate_fn=collate)\n"
        "    for batch in loader:\n"
        "        pass\n"
        "print('job ran')\n"
    )
    res = _job(script, tmp_path)
    assert res.returncode == 0 and "job ran" in res.stdout, res.stderr


def test_a_stale_try_fix_in_the_environment_changes_no_ordinary_run(tmp_path):
    """A GPUDIAG_FIX / GPUDIAG_TRY_STEPS left in the environment skipped the job's
    checkpoints in an ordinary `gpudiag run` (fixes loaded with every hook install)."""
    stale = {
        "GPUDIAG_FIX": json.dumps({"kind": "checkpoint", "values": {"every": 1000}}),
        "GPUDIAG_TRY_STEPS": str(tmp_path / "gone" / "steps"),
    }
    script = (
        "import os, torch\ntorch.save({'a': 1}, 'a.pt')\ntorch.save({'b': 2}, 'b.pt')\n"
        "print('saved now:', os.path.exists('a.pt'))\n"
    )
    res = _job(script, tmp_path, env=stale, under_run=True)
    assert res.returncode == 0, res.stderr
    assert "saved now: True" in res.stdout + res.stderr and (tmp_path / "a.pt").exists()
    assert "gpudiag try:" not in res.stderr
    res = _job(script.replace("'a.pt'", "'c.pt'"), tmp_path, env=stale)  # instrument()-less
    assert "saved now: True" in res.stdout


def test_steps_of_a_forked_child_are_not_merged_with_the_parents(tmp_path):
    """Step datagrams from a forked child were merged with the parent's (50.8 steps/s
    reported for 19.1 true)."""
    import subprocess
    import sys
    from array import array

    from gpudiag.probes.base import Target
    from gpudiag.probes.inject.gpudiag_hooks import STEP_WIDTH, _Channel
    from gpudiag.probes.inprocess.channel import HookProbe

    probe = HookProbe()
    assert probe.open(Target(0)).available
    try:

        def rows(n: int, t0: float) -> array:
            return array("d", [v for i in range(n) for v in (t0 + i, 0.05, 0, 8, 0, 0, 0, 0, 0)])

        head = {"v": 2, "width": STEP_WIDTH}
        assert _Channel(probe.path).send({**head, "pid": 1}, rows(3, 1000.0))
        child = (
            "import os, sys\nfrom array import array\n"
            "from gpudiag.probes.inject.gpudiag_hooks import _Channel\n"
            "row = lambda i: (2000.0 + i, 0.02, 0, 8, 0, 0, 0, 0, 0)\n"
            "rows = array('d', [v for i in range(5) for v in row(i)])\n"
            f"ok = _Channel({probe.path!r}).send({{'v': 2, 'width': 9, 'pid': 1}}, rows)\n"
            "sys.exit(0 if ok else 1)\n"
        )
        assert subprocess.run([sys.executable, "-c", child], timeout=60).returncode == 0
        steps = [s for s in probe.sample() if s.labels.get("kind") == "step"]
        assert len(steps) == 3 and probe.other_steps == 5  # the child's, though it claims pid 1
    finally:
        probe.close()


# ---- durations count from the first step ------------------------------------------------------

SLOW_START = (
    "import sys, time\ntime.sleep(float(sys.argv[1]))  # a slow start-up (a 20 s torch import)\n"
    "import torch\nm = torch.nn.Linear(64, 64)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
    "t0 = time.time()\nwhile time.time() - t0 < float(sys.argv[2]):\n"
    "    m(torch.randn(32, 64)).sum().backward()\n    opt.step()\n    opt.zero_grad()\n"
)


def _run_slow(tmp_path, duration: str, sleep: str, loop: str):
    job, out = tmp_path / "slow.py", tmp_path / "r.json"
    job.write_text(SLOW_START)
    # output through files and the job left running killed: no wait for the job to end
    r = gpudiag_until_sure(
        *("run", "-q", "--duration", duration, "--out", str(out)),
        *("--", sys.executable, str(job), sleep, loop),
        tmp=tmp_path,
        timeout=180,
    )
    return r, out


@pytest.mark.long
def test_run_duration_counts_from_the_first_step(tmp_path):
    """`run --duration 25` of a job with a 17.6 s start-up got 9.5-12 s of loop: the clock
    now restarts at the first step, so the whole look goes to the loop."""
    r, out = _run_slow(tmp_path, "10", "1", "14")
    assert r.returncode == 0, r.stderr
    ph = json.loads(out.read_text())["phases"]
    assert ph["startup_s"] >= 1.0 and ph["loop_s"] >= 8.5, ph
    assert "start-up only" not in r.stderr


def test_a_look_that_ends_before_the_first_step_says_so(tmp_path):
    """No step within --duration: the look ends on time, and says it saw start-up only."""
    r, _ = _run_slow(tmp_path, "2", "5", "0")
    assert r.returncode == 0, r.stderr
    assert "no step of the job's loop in 2 s: the look saw its start-up only" in r.stderr
