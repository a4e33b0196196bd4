"""`attach PID` profiles only the job the user named: a launcher is never init, a container's
PID 1, a shell leading its own session or another user's process (issue 26, item 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.session.targets import choose_target, not_a_launcher, own_ranks
from gpudiag.probes.dist.ranks import find_ranks
from tests.conftest import assert_one_line_error, gpudiag

RANK_ENV = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
SLEEPER = f"{sys.executable} -c 'import time; time.sleep(60)'; true"


def _shell_with_a_rank(new_session: bool) -> subprocess.Popen:
    """A bash (leading its own session or not) whose child is a Python rank."""
    shell = subprocess.Popen(["bash", "-c", SLEEPER], env=RANK_ENV, start_new_session=new_session)
    deadline = time.monotonic() + 20
    while not find_ranks(shell.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert find_ranks(shell.pid), "the rank did not start"
    return shell


def _stop(proc: subprocess.Popen) -> None:
    import psutil

    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_attach_1_is_bad_input():
    res = gpudiag("attach", "1", "--duration", "2")
    assert_one_line_error(res, "pid 1", "not a Python process", "init")


def test_a_session_leader_shell_is_not_a_launcher_even_with_a_rank_below():
    shell = _shell_with_a_rank(new_session=True)
    try:
        res = gpudiag("attach", str(shell.pid), "--duration", "2", "--quiet")
        assert_one_line_error(res, "not a Python process", "shell leading its own session")
    finally:
        _stop(shell)


def test_a_launcher_the_user_started_gives_its_rank_and_says_why():
    shell = _shell_with_a_rank(new_session=False)
    try:
        rank = find_ranks(shell.pid)[0]
        choice = choose_target(shell.pid)
    finally:
        _stop(shell)
    assert choice.pid == rank.pid and choice.root == shell.pid
    assert [r.pid for r in choice.ranks] == [rank.pid]
    assert "launcher" in choice.why and f"rank 0 pid {rank.pid}" in choice.why


def test_another_users_process_and_ranks_are_never_taken():
    shell = _shell_with_a_rank(new_session=False)
    try:
        ranks = find_ranks(shell.pid)
        assert "another user" in (not_a_launcher(shell.pid, me=os.geteuid() + 4242) or "")
        assert not_a_launcher(shell.pid) is None
        assert own_ranks(ranks, os.geteuid() + 4242) == []
        assert own_ranks(ranks, os.geteuid()) == ranks
    finally:
        _stop(shell)


def test_a_plain_non_python_process_is_bad_input():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(UsageError, match="not a Python process"):
            choose_target(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


RELOADER = """
import subprocess, sys, time


def restart_with_reloader():
    subprocess.call([sys.executable, "-c", "import time; time.sleep(60)"])


restart_with_reloader()
"""


def test_attach_to_a_reloader_profiles_the_server_it_supervises(tmp_path):
    """`app.run(debug=True)`: the process started waits in Werkzeug's reloader while its child
    serves; attach to the parent profiles the child, and says so."""
    from gpudiag.probes.stacks.pyspy import find_py_spy

    if find_py_spy() is None:
        pytest.skip("needs py-spy")
    folder = tmp_path / "site" / "werkzeug"
    folder.mkdir(parents=True)
    (folder / "_reloader.py").write_text(RELOADER)
    parent = subprocess.Popen([sys.executable, str(folder / "_reloader.py")])
    try:
        import psutil

        deadline = time.monotonic() + 20
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # the parent inside its wait
        (child,) = psutil.Process(parent.pid).children()
        got = choose_target(parent.pid)
        assert got.pid == child.pid and got.root == parent.pid
        assert f"only supervises its child pid {child.pid}" in got.why
        assert choose_target(child.pid).pid == child.pid  # the server named: itself
    finally:
        _stop(parent)


def test_a_busy_process_with_children_is_profiled_itself():
    """A training loop with DataLoader workers: busy itself, so never taken for a supervisor
    (and never paused by a py-spy dump to find out)."""
    busy = (
        "import subprocess, sys, time\n"
        "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "t = time.time()\n"
        "while time.time() - t < 60:\n"
        "    sum(range(10000))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", busy])
    try:
        import psutil

        deadline = time.monotonic() + 20
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert choose_target(parent.pid).pid == parent.pid
    finally:
        _stop(parent)
