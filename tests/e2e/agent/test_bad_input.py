"""End to end: more bad input, refused before anything starts: one line on stderr, exit 2, no
traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpudiag.agent.fleet.identity import other_user
from tests.conftest import assert_one_line_error


def test_attach_to_a_zombie(cli):
    done = subprocess.Popen(["true"])
    try:
        time.sleep(0.5)  # exited, not reaped: a zombie
        assert_one_line_error(cli("attach", str(done.pid)), "already exited")
    finally:
        done.wait()


def test_another_users_process_is_explained(monkeypatch):
    """gpudiag never raises its privileges: it says whose process it is and what to do."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        assert other_user(job.pid) is None  # our own process
        monkeypatch.setattr(os, "geteuid", lambda: 4242)
        why = other_user(job.pid)
        if os.getuid() == 4242:
            pytest.skip("running as uid 4242")
        assert why is not None and "belongs to user" in why and "uid 4242" in why
        assert "run gpudiag as that user" in why
    finally:
        job.kill()
        job.wait()
