"""`run --tui` owns its terminal: the job's output goes to a scrolling log panel and a file,
never over the UI; `q` ends the job as Ctrl-C does under `run`; the exit code is the job's;
the header says when and how the job ended (issue 26, item 4)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from textual.widgets import Log

from gpudiag.agent.session.live import JobView
from gpudiag.tui.app import DiagnosisApp
from gpudiag.tui.feeds import Feed
from tests.e2e.tui.test_app import run, text_of
from tests.tui.test_app import starved_doc


def test_job_output_goes_to_the_log_panel_and_the_header_says_how_it_ended():
    doc = starved_doc()
    lines = [["step 1 loss 0.5", "step 2 loss 0.4"], [], ["step 3 loss 0.3"]]
    state = {"ended": None, "stopped": 0}

    def output() -> list[str]:
        return lines.pop(0) if lines else []

    feed = Feed(
        "run pid 42",
        lambda: doc,
        live=True,
        stop=lambda: state.__setitem__("stopped", state["stopped"] + 1),
        output=output,
        output_path="r.job.log",
        ended=lambda: state["ended"],
    )
    app = DiagnosisApp(feed, clock=False)

    async def steps(pilot):
        log = app.screen.query_one("#joblog", Log)
        assert "r.job.log" in str(log.border_title)
        await pilot.pause(2.3)  # two refreshes
        assert "step 1 loss 0.5" in log.lines and "step 3 loss 0.3" in log.lines
        status = text_of(app.screen.query_one("#status"))
        assert status.startswith("live")
        state["ended"] = "job exited 3 at 21:04:05"
        await pilot.pause(1.2)
        assert text_of(app.screen.query_one("#status")).startswith("job exited 3 at 21:04:05")
        await pilot.press("q")

    run(app, steps, size=(100, 30))
    assert state["stopped"] == 1


def _sigint_default() -> None:
    """SIGINT as a terminal's job has it: a suite started in the background by a
    non-interactive shell (`.ci/run &`) ignores SIGINT, and its children inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_job_view_interrupts_like_ctrl_c_and_says_how_the_job_ended():
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\ntry:\n time.sleep(60)\nexcept KeyboardInterrupt:\n raise SystemExit(7)",
        ],
        preexec_fn=_sigint_default,
    )
    view = JobView(job, lambda: [], None)
    time.sleep(1.0)
    assert view.ended() is None
    view.interrupt()
    assert job.wait(timeout=30) == 7
    assert view.ended().startswith("job exited 7 at ")
    sleeper = subprocess.Popen(["sleep", "30"], preexec_fn=_sigint_default)
    view = JobView(sleeper, lambda: [], None)
    view.interrupt()  # sleep does not catch SIGINT
    sleeper.wait(timeout=10)
    assert view.ended().startswith("job killed by SIGINT at ")


JOB = textwrap.dedent(
    """
    import sys, time
    try:
        for i in range(100000):
            print(f"step {i} loss 0.002", flush=True)
            print(f"warn {i}", file=sys.stderr, flush=True)
            time.sleep(0.2)
    except KeyboardInterrupt:
        print("job: interrupted, saving", flush=True)
        sys.exit(7)
    """
)


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real terminal")
def test_run_tui_in_a_real_terminal_keeps_the_job_off_the_screen_and_q_ends_it(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    name = f"gpudiag-{uuid.uuid4().hex[:8]}"
    cmd = (
        f"cd {tmp_path} && {sys.executable} -m gpudiag.agent.cli.main run --tui --out r.json "
        f"-- {sys.executable} job.py; echo $? > rc.txt; sleep 60"
    )
    _tmux("new-session", "-d", "-s", name, "-x", "100", "-y", "30", cmd)
    try:
        screen = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            time.sleep(1.0)
            screen = _tmux("capture-pane", "-p", "-t", name)
            if "job output" in screen and re.search(r"step ([3-9]|\d\d+) loss", screen):
                break
        assert "job output" in screen and re.search(r"step \d+ loss", screen), screen
        rows = screen.splitlines()
        assert "gpudiag" in rows[0]  # the header is the UI's, not the job's
        log_top = next(i for i, r in enumerate(rows) if "job output" in r)
        leaked = [r for r in rows[:log_top] if re.search(r"\b(step|warn) \d", r)]
        assert not leaked, screen
        _tmux("send-keys", "-t", name, "q")
        rc = tmp_path / "rc.txt"
        deadline = time.monotonic() + 60
        while not rc.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert rc.exists(), _tmux("capture-pane", "-p", "-t", name)
        assert rc.read_text().strip() == "7"  # the job's exit code
        log = (tmp_path / "r.job.log").read_text()
        assert "step 3 loss" in log and "warn 3" in log and "job: interrupted, saving" in log
        assert (tmp_path / "r.json").exists()
    finally:
        _tmux("kill-session", "-t", name)
    assert Path(tmp_path / "r.json").stat().st_size > 0
