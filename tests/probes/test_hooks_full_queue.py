"""The hooks keep what the agent's full queue refused and send it with the next flush: a
Unix datagram socket queues at most net.unix.max_dgram_qlen datagrams (10 by default), and a
server's front end and its model worker, each flushing every 0.1 s, filled it between two of
the agent's 0.5 s reads (LitServe read 32-37% under its clients' request rate)."""

from __future__ import annotations

import os
import socket
import threading

from gpudiag.probes.base import Target
from gpudiag.probes.inject import gpudiag_hooks
from gpudiag.probes.inprocess.channel import HookProbe


def _state(path: str) -> gpudiag_hooks._State:
    return gpudiag_hooks._State(gpudiag_hooks._Channel(path))


def _fill(path: str) -> int:
    """Datagrams sent until the socket's queue refuses one (its length)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    n = 0
    try:
        while n < 100_000:
            s.sendto(b"x", path)
            n += 1
    except BlockingIOError:
        return n
    finally:
        s.close()
    return n


def _requests(probe: HookProbe) -> int:
    return sum(1 for s in probe.sample() if s.labels.get("kind") == "request")


def test_rows_refused_by_a_full_queue_go_with_the_next_flush():
    probe = HookProbe()
    assert probe.open(Target(os.getpid())).available
    try:
        st = _state(probe.path)
        queued = _fill(probe.path)
        assert 0 < queued < 100_000  # a queue of bounded length: the condition met live
        for i in range(5):
            st.serve.requests.append([1.0e9 + i, 0.01, 1.0])
        st.flush()
        assert st.channel.full and st.channel.dropped == 0
        assert len(st.serve.requests) == 5  # kept, not dropped
        probe.sample()  # the agent reads: the queue drains (the filler's bytes are not ours)
        st.serve.requests.append([1.0e9 + 5, 0.01, 1.0])
        st.flush()
        assert not st.channel.full and st.serve.requests == []
        assert _requests(probe) == 6  # every request once, the refused ones first
    finally:
        probe.close()


def test_no_agent_still_drops_and_keeps_nothing(tmp_path):
    folder = tmp_path / "gone"
    folder.mkdir(mode=0o700)
    st = _state(str(folder / "agent.sock"))
    st.serve.requests.append([1.0e9, 0.01, 1.0])
    st.flush()
    assert not st.channel.full and st.channel.dropped == 1 and st.serve.requests == []


def test_kept_rows_are_bounded():
    probe = HookProbe()
    assert probe.open(Target(os.getpid())).available
    try:
        st = _state(probe.path)
        _fill(probe.path)
        for _ in range(3):
            st.serve.requests.extend([[1.0e9, 0.01, 1.0]] * gpudiag_hooks._serve.MAX_ROWS)
            st.flush()
        assert len(st.serve.requests) == gpudiag_hooks._serve.MAX_ROWS
    finally:
        probe.close()


def test_steps_refused_at_exit_wait_a_moment_for_a_busy_agent():
    """At exit the job's last steps are offered again while the agent's queue is full: an
    agent busy for a moment on a loaded box (a starved loader's run read 37 of 65 steps)
    still gets every step."""
    probe = HookProbe()
    assert probe.open(Target(os.getpid())).available
    try:
        st = _state(probe.path)
        _fill(probe.path)
        st.pending.extend([1.0] * (gpudiag_hooks.STEP_WIDTH * 3))  # three steps kept
        st.flush()
        assert st.channel.full and len(st.pending) == 3 * gpudiag_hooks.STEP_WIDTH
        threading.Timer(0.3, probe.sample).start()  # the agent reads again 0.3 s later
        st.exit_flush(wait_s=5.0)
        assert not st.channel.full and len(st.pending) == 0
        steps = [s for s in probe.sample() if s.labels.get("kind") == "step"]
        assert len(steps) == 3
    finally:
        probe.close()


def test_exit_does_not_wait_with_nothing_refused(tmp_path, monkeypatch):
    folder = tmp_path / "gone"
    folder.mkdir(mode=0o700)
    st = _state(str(folder / "agent.sock"))
    st.pending.extend([1.0] * gpudiag_hooks.STEP_WIDTH)
    slept: list[float] = []
    monkeypatch.setattr(gpudiag_hooks.time, "sleep", slept.append)
    st.exit_flush(wait_s=5.0)
    assert slept == [] and len(st.pending) == 0  # no agent: dropped at once, never waited on
