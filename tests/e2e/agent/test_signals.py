"""End to end: signals to gpudiag and faults of the target: the report is always written and says
what happened; under `run` the job is neither orphaned nor killed unless the user asks."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from gpudiag.agent.session.targetwatch import TargetWatch

# a job that says when it got SIGTERM (as a training script saving a checkpoint would)
TERM_AWARE = (
    "import signal, sys, time\n"
    "def bye(n, f):\n"
    "    print('job: got signal', n, file=sys.stderr, flush=True); sys.exit(7)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def _default_hup() -> None:
    # under `nohup` (a CI runner may use it) SIGHUP is ignored, and an ignored signal stays
    # ignored across exec: the job would never see the SIGHUP gpudiag passes on
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def start(*args: str, cwd=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gpudiag.agent.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        preexec_fn=_default_hup,
    )


def wait_for(proc: subprocess.Popen, text: str, timeout: float = 30.0) -> str:
    """Read the agent's stderr until `text` shows (then it is sampling)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while text not in seen:
        left = deadline - time.monotonic()
        assert left > 0 and proc.poll() is None, f"never saw {text!r}: {seen}"
        ready, _, _ = select.select([proc.stderr], [], [], left)
        if ready:
            seen += proc.stderr.readline()
    return seen


def wait_for_exited(proc: subprocess.Popen) -> str:
    """What an exited agent wrote on stderr that is already in the pipe."""
    os.set_blocking(proc.stderr.fileno(), False)
    return proc.stderr.read() or ""


def report(path) -> dict:
    return json.loads(path.read_text())


def finish(proc: subprocess.Popen, timeout: float = 40.0) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in err, err
    return out, err


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 7), (signal.SIGHUP, 128 + 1)])
def test_run_passes_term_and_hup_on_and_writes_the_report(tmp_path, sig, code):
    out = tmp_path / "r.json"
    agent = start(
        "run", "--no-inject", "--out", str(out), "--", sys.executable, "-c", TERM_AWARE, "60"
    )
    wait_for(agent, "profiling pid")
    time.sleep(1.0)
    agent.send_signal(sig)
    _, err = finish(agent)
    assert agent.returncode == code, err  # the job's own exit status, passed through
    if sig == signal.SIGTERM:
        assert "job: got signal 15" in err  # the job got the scheduler's SIGTERM too
    doc = report(out)
    assert doc["run"]["end_reason"] == "interrupted"
    assert doc["run"]["exit_code"] in (7, -1)


def test_run_interrupted_alone_waits_for_the_job(tmp_path):
    """SIGINT to gpudiag only (not to the job): the report is written, the job runs on to
    its own end, and gpudiag exits after it with its code: not orphaned, not killed."""
    out, done = tmp_path / "r.json", tmp_path / "done"
    job = (  # runs until told to end (60 s at most)
        "import os, sys, time\nt = time.time()\n"
        "while not os.path.exists(sys.argv[1]) and time.time() - t < 60:\n    time.sleep(0.05)\n"
    )
    agent = start(
        "run", "--no-inject", "--out", str(out), "--", sys.executable, "-c", job, str(done)
    )
    wait_for(agent, "profiling pid")
    agent.send_signal(signal.SIGINT)
    wait_for(agent, "waiting for the job")
    assert out.exists()  # written before waiting
    time.sleep(0.5)
    assert agent.poll() is None  # still waiting for the job
    done.touch()  # the job ends: gpudiag follows
    _, err = finish(agent)
    assert agent.returncode == 0, err
    assert report(out)["run"]["end_reason"] == "interrupted"


def test_second_interrupt_exits_at_once_and_leaves_the_job(tmp_path):
    out = tmp_path / "r.json"
    job_pid = tmp_path / "pid"
    script = (
        "import os, signal, sys, time\n"
        f"open({str(job_pid)!r}, 'w').write(str(os.getpid()))\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "time.sleep(60)\n"
    )
    agent = start("run", "--no-inject", "--out", str(out), "--", sys.executable, "-c", script)
    wait_for(agent, "profiling pid")
    agent.send_signal(signal.SIGINT)
    wait_for(agent, "waiting for the job")
    agent.send_signal(signal.SIGINT)
    # (the job still holds the pipes gpudiag gave it: wait for gpudiag, not for their end)
    assert agent.wait(timeout=10) == 130
    assert "interrupted again" in wait_for_exited(agent)
    pid = int(job_pid.read_text())
    try:
        os.kill(pid, 0)  # the user interrupted twice: the job was left running, not killed
    finally:
        os.kill(pid, signal.SIGKILL)
    assert report(out)["run"]["end_reason"] == "interrupted"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_attach_stops_on_term_and_hup_and_leaves_the_job(tmp_path, sig):
    out = tmp_path / "r.json"
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        agent = start("attach", str(job.pid), "--out", str(out))
        wait_for(agent, "attached to pid")
        agent.send_signal(sig)
        finish(agent)
        assert agent.returncode == 0
        assert report(out)["run"]["end_reason"] == "interrupted"
        assert job.poll() is None
    finally:
        job.kill()
        job.wait()


def test_attached_job_killed_exec_and_run_job_killed(tmp_path):
    # attached job SIGKILLed
    out = tmp_path / "killed.json"
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    agent = start("attach", str(job.pid), "--out", str(out))
    wait_for(agent, "attached to pid")
    job.kill()
    job.wait()
    finish(agent)
    assert agent.returncode == 0 and report(out)["run"]["end_reason"] == "target_exited"

    # attached job exec()s another program: stopped at once, and said so
    out = tmp_path / "exec.json"
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time; time.sleep(3); os.execv('/bin/sleep', ['sleep', '30'])",
        ]
    )
    try:
        agent = start("attach", str(job.pid), "--out", str(out))
        wait_for(agent, "attached to pid")
        finish(agent, timeout=25)
        doc = report(out)
        assert doc["run"]["end_reason"] == "target_exited"
        assert any("replaced its program (exec) with /" in e["message"] for e in doc["errors"])
        assert job.poll() is None  # still running `sleep`: gpudiag did not touch it
    finally:
        job.kill()
        job.wait()

    # a launched job killed by SIGKILL: the report says so, the exit status is 128 + 9
    out = tmp_path / "run.json"
    agent = start(
        "run",
        "--no-inject",
        "--out",
        str(out),
        "--",
        sys.executable,
        "-c",
        "import os, time; time.sleep(2); os.kill(os.getpid(), 9)",
    )
    _, err = finish(agent)
    assert agent.returncode == 137, err
    doc = report(out)
    assert doc["run"]["exit_code"] == -9
    assert any(e["message"] == "the job was killed by SIGKILL" for e in doc["errors"])


def test_pid_reused_after_the_job_ended():
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        watch = TargetWatch(job.pid)
        assert watch.changed() is None
        watch.start = "1"  # as if another process had started under the same number
        assert "was reused by another process" in (watch.changed() or "")
    finally:
        job.kill()
        job.wait()


def test_sigterm_quits_the_live_ui_and_the_session_ends():
    """`--tui`: SIGTERM quits the UI as `q` does, so the caller still writes the report."""
    from gpudiag.agent.base.config import load_settings
    from gpudiag.agent.session.live import run_with_tui
    from gpudiag.agent.session.session import Session, SessionOptions, SessionParts, Subject
    from gpudiag.probes.base import Target

    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        session = Session(
            Target(job.pid),
            load_settings(None),
            SessionOptions(progress=False, cpu_budget=None),
            SessionParts(probes=[]),
        )
        timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
        timer.start()
        subject = Subject("attach", ["x"], job.pid, "unused.json")
        result = run_with_tui(session, subject, headless=True)
        assert result.end_reason == "stopped"
        assert job.poll() is None  # the job was not touched
    finally:
        job.kill()
        job.wait()


def _catches_sigterm(parent: int) -> bool:
    """The TERM_AWARE job below `parent` has its SIGTERM handler installed (SigCgt)."""
    import psutil

    try:
        kids = [k for k in psutil.Process(parent).children() if TERM_AWARE in k.cmdline()]
    except psutil.Error:
        return False
    for kid in kids:
        try:
            with open(f"/proc/{kid.pid}/status") as f:
                caught = next(ln for ln in f if ln.startswith("SigCgt:")).split()[1]
        except (OSError, StopIteration):
            continue
        if int(caught, 16) & (1 << (signal.SIGTERM - 1)):
            return True
    return False


def _read_pty(fd: int, until: float, done=None) -> str:
    """What the pty shows until `until`, or until `done(text so far)` says enough."""
    seen = b""
    while time.monotonic() < until:
        if done is not None and done(seen.decode("utf-8", "replace")):
            break
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            seen += chunk
    return seen.decode("utf-8", "replace")


def test_run_tui_passes_sigterm_on_to_the_job(tmp_path):
    """Issue 23 #9: `run --tui` quit its UI on SIGTERM but never passed it to the job, which
    `run` does. A real terminal (a pty) for the UI."""
    import pty

    out = tmp_path / "r.json"
    master, slave = pty.openpty()
    cmd = [sys.executable, "-m", "gpudiag.agent.cli.main", "run", "--tui", "--no-inject"]
    cmd += ["--out", str(out), "--", sys.executable, "-c", TERM_AWARE, "60"]
    agent = subprocess.Popen(
        cmd, stdin=slave, stdout=slave, stderr=slave, preexec_fn=_default_hup, close_fds=True
    )
    os.close(slave)
    try:
        # the UI is up (its job-output panel drawn) and the job has its SIGTERM handler
        up = lambda text: "job output" in text and _catches_sigterm(agent.pid)  # noqa: E731
        _read_pty(master, time.monotonic() + 12, up)
        agent.send_signal(signal.SIGTERM)
        seen = _read_pty(master, time.monotonic() + 40)
        code = agent.wait(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        os.close(master)
    # under the UI the job's output goes to its log panel and REPORT.job.log (issue 26 #4)
    log = (tmp_path / "r.job.log").read_text()
    assert "job: got signal 15" in log, seen[-2000:] + log[-2000:]
    # never over the UI: only quoted in the summary's "Last lines of the job's stderr" (there
    # when the job wrote it before the report was made, a race of a few ms), never raw
    raw = [ln for ln in seen.splitlines() if "job: got signal 15" in ln and "| job:" not in ln]
    assert not raw, seen[-2000:]
    assert code == 7, seen[-2000:]  # the job's own exit status, passed through
    assert report(out)["run"]["end_reason"] in ("interrupted", "stopped", "target_exited")


PRINTS_TO_STDERR = """\
import os, sys, time
open("pid", "w").write(str(os.getpid()))
try:
    for i in range(50):
        print(f"job line {i}", file=sys.stderr, flush=True)
        time.sleep(0.1)
    open("end", "w").write("survived")
except BaseException as exc:
    open("end", "w").write(f"died: {exc!r}")
"""


def _poll_file(path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.1)
    return ""


def test_a_sigkilled_gpudiag_leaves_the_job_writing_to_its_stderr(tmp_path):
    """Issue 53 N61: the job's stderr was a pipe only gpudiag read and `cat` took over only
    in close(): after gpudiag was SIGKILLed (the OOM killer) the job died of
    BrokenPipeError on its next write."""
    (tmp_path / "job.py").write_text(PRINTS_TO_STDERR)
    err = tmp_path / "gpudiag.stderr"
    with open(err, "w") as fe:
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpudiag.agent.cli.main", "run", "-q", "--out", "r.json"]
            + ["--", sys.executable, "job.py"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=fe,
        )
    job = 0
    try:
        assert _poll_file(tmp_path / "pid", 60), err.read_text()
        job = int((tmp_path / "pid").read_text())
        deadline = time.monotonic() + 30
        while "job line 3" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        agent.kill()
        agent.wait(timeout=10)
        assert _poll_file(tmp_path / "end", 60) == "survived"
        assert "job line 49" in err.read_text()  # what it wrote after, copied on
    finally:
        if agent.poll() is None:
            agent.kill()
        if job:
            try:
                os.kill(job, signal.SIGKILL)
            except ProcessLookupError:
                pass
