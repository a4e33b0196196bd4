"""End to end: the serving hooks on gunicorn's own workers (sync and gthread): each request timed
once, from its connection's accept to its answer, with the requests in flight; answers unchanged;
and the hooks' state in a forked child (gunicorn's workers are its master's forks)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.inject import gpudiag_hooks
from gpudiag.probes.inprocess.channel import HookProbe

pytest.importorskip("gunicorn")


def test_the_hooks_state_in_a_forked_child_starts_empty_and_unlocked(tmp_path):
    """A fork while another thread holds the recorder's lock and the parent has rows buffered:
    the child neither hangs on that lock nor sends the parent's rows; it sends its own."""
    probe = HookProbe()
    assert probe.open(Target(os.getpid())).available
    st = gpudiag_hooks._State(gpudiag_hooks._Channel(probe.path))
    old = gpudiag_hooks._state
    gpudiag_hooks._state = st
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with st.serve.lock, st._flushing:
            held.set()
            release.wait(10)

    try:
        st.serve.end_request(*st.serve.start_request(None))  # the parent's row, buffered
        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: one request and a flush, killed if it hangs
            code = 1
            try:
                signal.alarm(5)
                st.serve.end_request(*st.serve.start_request(None))
                st.flush()
                code = 0
            finally:
                os._exit(code)
        release.set()
        holder.join(10)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.1)
        got = [s for s in probe.sample() if s.labels.get("kind") == "request"]
        assert len(got) == 1  # the child's one request, not the parent's too
        _, parent_rows = st.serve.take()
        assert len(parent_rows) == 1  # still the parent's to send
    finally:
        gpudiag_hooks._state = old
        probe.close()
