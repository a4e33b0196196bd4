"""Signals to gpudiag and faults of the target: the report is always written and says what
happened; under `run` the job is neither orphaned nor killed unless the user asks."""

from __future__ import annotations

import os
import signal
import time

import pytest

from gpudiag.agent.session.signals import StopSignals


def test_stop_signals_flag_then_exit(capfd):
    seen = []
    with StopSignals(lambda s, n: seen.append((s, n))) as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stops.stopping and stops.signum == signal.SIGTERM
        with pytest.raises(SystemExit) as exc:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert exc.value.code == 130
    assert seen == [(signal.SIGTERM, 1), (signal.SIGINT, 2)]
    assert signal.getsignal(signal.SIGTERM) is not stops._handle  # restored
    assert "interrupted again" in capfd.readouterr().err


def test_nohup_keeps_sighup_ignored():
    """`nohup gpudiag run ...`: closing the terminal must not stop the profiling."""
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with StopSignals() as stops:
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            assert not stops.stopping
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)
