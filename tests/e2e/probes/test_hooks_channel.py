"""End to end: the hooks' channel is private to the job's user and carries only data."""

from __future__ import annotations

import os
import socket

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.inprocess.channel import HookProbe
from tests.probes.test_hooks_channel import datagram


@pytest.mark.skipif(not hasattr(os, "fork") or os.geteuid() != 0, reason="needs root to setuid")
def test_datagrams_from_another_user_are_refused():
    probe = HookProbe()
    assert probe.open(Target(0)).available
    try:
        codes = {}
        for mode in (0o600, 0o666):  # as made; and as if its permissions had been opened up
            os.chmod(probe.path, mode)
            os.chmod(os.path.dirname(probe.path), 0o700 if mode == 0o600 else 0o755)
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    s.sendto(datagram(9.0), probe.path)
                    os._exit(0)
                except PermissionError:
                    os._exit(13)
                except BaseException:
                    os._exit(1)
            codes[mode] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        assert codes[0o600] == 13  # the file permissions keep other users out...
        assert codes[0o666] == 0
        assert probe.sample() == [] and probe.rejected == 1  # ...and so do the credentials
    finally:
        probe.close()
