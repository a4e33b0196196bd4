"""A look that saw only start-up is never sure (issue 55): `run --duration` counts from the
job's first step, its clock held while the hooks are heard from and no step came (a
torch.compile before the first step), and a look that saw none says so."""

from __future__ import annotations

import json
import sys
import textwrap
import types

import pytest

from gpudiag.agent.session.session import STARTUP_WAIT_S, Session
from tests.conftest import gpudiag_until_sure


def _session(first_step_at, heard: bool, attached: bool = False):
    probe = types.SimpleNamespace(messages=1 if heard else 0)
    fake = types.SimpleNamespace(
        opts=types.SimpleNamespace(attached=attached), first_step_at=first_step_at
    )
    fake.hooks_heard = lambda: heard and probe.messages > 0
    return fake


@pytest.mark.parametrize(
    "first,heard,since_launch,want",
    [
        (None, True, 30.0, 0.0),  # hooks heard, no step yet: start-up, the clock waits
        (None, False, 30.0, 30.0),  # no hooks (no torch yet): from launch, as before
        (None, True, STARTUP_WAIT_S + 5, STARTUP_WAIT_S + 5),  # waited long enough
        (10.0, True, 30.0, 20.0),  # from the first step
    ],
)
def test_the_duration_counts_from_the_first_step(first, heard, since_launch, want, monkeypatch):
    import gpudiag.agent.session.session as session_mod

    monkeypatch.setattr(session_mod.time, "time", lambda: 1000.0 + since_launch)
    fake = _session(None if first is None else 1000.0 + first, heard)
    assert Session.looked(fake, 1000.0) == pytest.approx(want)


def test_run_duration_counts_from_the_first_step_after_a_long_start_up(tmp_path):
    """A job that imports torch, then spends 12 s before its first step (as a compile does):
    `run --duration 10` looks at 10 s of its loop, not at its start-up (the clock waits once
    the hooks are heard: torch imported within the 10 s)."""
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(
            """
            import time, torch
            time.sleep(12)  # start-up after the hooks loaded: no step yet
            m = torch.nn.Linear(64, 64); o = torch.optim.SGD(m.parameters(), lr=0.01)
            t0 = time.time()
            while time.time() - t0 < 60:
                m(torch.randn(32, 64)).sum().backward(); o.step(); o.zero_grad()
            """
        )
    )
    out = tmp_path / "r.json"
    r = gpudiag_until_sure(
        "run",
        "-q",
        "--duration",
        "10",
        "--out",
        str(out),
        "--",
        sys.executable,
        str(job),
        tmp=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["run"]["end_reason"] == "duration_reached"
    assert doc["run"]["duration_s"] >= 12 + 10  # the start-up, then 10 s of loop
    assert doc["workload"]["kind"] == "training"
    assert "no step of the job's loop" not in r.stderr
