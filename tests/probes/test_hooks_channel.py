"""The hooks' channel is private to the job's user and carries only data."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import time
from array import array
from pathlib import Path

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.inject import gpudiag_hooks
from gpudiag.probes.inprocess.channel import HookProbe

ROOT = Path(__file__).parents[2]


def datagram(step_s: float = 0.5) -> bytes:
    rows = array("d", [time.time(), step_s, 0.1, 32, 0, 0, 0, 0, 0])
    return json.dumps({"v": 2, "width": 9}).encode() + b"\n" + rows.tobytes()


def test_run_channel_is_a_private_folder_and_socket():
    probe = HookProbe()
    assert probe.open(Target(0)).available
    try:
        folder = os.path.dirname(probe.path)
        st = os.lstat(folder)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        assert stat.S_IMODE(os.stat(probe.path).st_mode) == 0o600
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.sendto(datagram(), probe.path)
        samples = probe.sample()
        assert [s.values["step_time_s"] for s in samples] == [0.5]
    finally:
        probe.close()
    assert not os.path.exists(folder)  # nothing left behind


def test_attach_folder_made_by_someone_else_or_a_link_is_refused(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "gpudiag-link"
    link.symlink_to(target)
    status = HookProbe(str(link / "agent-1.sock"), optional=True).open(Target(0))
    assert not status.available and "not this user's own folder" in status.reason
    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder owned by another user")
    squat = tmp_path / "gpudiag-squat"
    squat.mkdir(mode=0o777)
    os.chown(squat, 65534, 65534)
    status = HookProbe(str(squat / "agent-1.sock"), optional=True).open(Target(0))
    assert not status.available and "made by uid 65534" in status.reason
    assert not (squat / "agent-1.sock").exists()


def test_attach_folder_of_ours_is_made_private(tmp_path):
    folder = tmp_path / "gpudiag-me"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    probe = HookProbe(str(folder / "agent-1.sock"), optional=True)
    assert probe.open(Target(0)).available
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    finally:
        probe.close()


def test_the_job_side_sends_only_into_a_private_folder(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    channel = gpudiag_hooks._Channel(str(open_folder / "hooks.sock"))
    assert channel.send({"v": 2}) is False and channel.dropped == 1
    probe = HookProbe()
    assert probe.open(Target(0)).available
    try:
        channel = gpudiag_hooks._Channel(probe.path)
        assert channel.send({"v": 2, "width": 9}, array("d", [time.time(), 0.25] + [0] * 7))
        assert [s.values["step_time_s"] for s in probe.sample()] == [0.25]
    finally:
        probe.close()


def test_a_channel_folder_remade_by_another_user_after_the_agent_left_gets_nothing():
    """Issue 53 R1a: after `run --duration` ended, gpudiag removed its channel folder while
    the job ran on; another user re-made the folder and bound a socket in it, and the job,
    which had remembered the folder as private, sent its steps there."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder owned by another user")
    probe = HookProbe()
    assert probe.open(Target(0)).available
    path = probe.path
    channel = gpudiag_hooks._Channel(path)
    try:
        assert channel.send({"v": 2, "width": 9}, array("d", [time.time(), 0.25] + [0] * 7))
        assert len(probe.sample()) == 1
    finally:
        probe.close()
    folder = os.path.dirname(path)
    assert not os.path.exists(folder)
    os.mkdir(folder)  # the attacker's: same name, their uid, open to all
    os.chmod(folder, 0o777)
    os.chown(folder, 65534, 65534)
    spy = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        spy.bind(path)
        spy.setblocking(False)
        assert channel.send({"v": 2, "width": 9}) is False and channel.dropped == 1
        assert _received(spy) == []
    finally:
        spy.close()
        os.unlink(path)
        os.rmdir(folder)


# PyTorch writes NCCL flight-recorder dumps with pickle; their one reader refuses every class
# and function a pickle names (plain data only), tested in tests/probes/test_flight_recorder.py
DATA_ONLY_UNPICKLER = ROOT / "probes" / "dist" / "flight_recorder.py"


def test_nothing_read_is_ever_executed():
    """Reports, recordings, config files and the hooks' datagrams are parsed as data (JSON,
    TOML, packed doubles): no pickle, eval or exec anywhere in gpudiag but the data-only
    unpickler of NCCL's dumps."""
    pattern = re.compile(r"\b(pickle|marshal|shelve)\b|(?<![\w.])(eval|exec)\(|yaml\.load\(")
    for folder in ("agent", "probes", "analyzers", "tui"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == DATA_ONLY_UNPICKLER:
                src = path.read_text()
                assert "def find_class" in src and "raise pickle.UnpicklingError" in src
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                assert not pattern.search(line), f"{path}:{n}: {line.strip()}"


def test_no_endpoint_listens_on_every_interface_by_default():
    """Any network endpoint binds 127.0.0.1 unless the user says otherwise: no all-interfaces
    address is written into gpudiag's code as a default."""
    pattern = re.compile(r"""["'](0\.0\.0\.0|::|\[::\])["']""")
    for folder in ("agent", "probes", "tui"):
        for path in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                assert not pattern.search(line), f"{path}:{n}: {line.strip()}"


def test_every_metrics_endpoint_defaults_to_localhost():
    """Each command with a metrics endpoint listens on 127.0.0.1 unless told otherwise."""
    import argparse

    from gpudiag.agent.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    checked = 0
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.dest == "metrics_addr":
                assert action.default == "127.0.0.1", name
                checked += 1
    assert checked >= 1  # run, attach, watch...


@pytest.fixture
def squatted(tmp_path):
    """A folder another local user pre-created (mode 777, uid 65534), with a socket there
    listening for whatever the job sends: the attack of issue 23 #1."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder owned by another user")
    folder = tmp_path / "gpudiag-0"
    folder.mkdir()
    folder.chmod(0o777)
    os.chown(folder, 65534, 65534)
    spy = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = folder / f"agent-{os.getpid()}.sock"
    spy.bind(str(path))
    spy.setblocking(False)
    yield path, spy
    spy.close()


def _received(spy: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(spy.recv(1 << 20))
        except BlockingIOError:
            return out


def test_collective_and_capture_channels_refuse_another_users_folder(squatted):
    """Issue 23 #1: gpudiag_dist and gpudiag_capture sent to the squatted folder."""
    from gpudiag.probes.inject import gpudiag_capture, gpudiag_dist

    path, spy = squatted
    gpudiag_dist._Dist(str(path)).send()
    cap = gpudiag_capture.Capture(None, str(path), 1)
    assert cap._send({"steps": []}) is False
    assert _received(spy) == []
    # ...and the control-path: a request file planted there never starts the profiler
    request = Path(str(path) + gpudiag_capture.REQUEST_SUFFIX)
    request.write_text("5")
    watcher = gpudiag_capture.Watcher(None, str(path))
    watcher.on_step()
    assert watcher.capture is None and request.exists()


def test_the_same_channels_send_into_a_private_folder(tmp_path):
    """The check lets the job's own private folder through (so the test above can fail)."""
    from gpudiag.probes.inject import gpudiag_capture, gpudiag_dist

    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    path = folder / "agent.sock"
    spy = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    spy.bind(str(path))
    spy.setblocking(False)
    try:
        gpudiag_dist._Dist(str(path)).send()
        assert gpudiag_capture.Capture(None, str(path), 1)._send({"steps": []})
        assert len(_received(spy)) == 2
    finally:
        spy.close()


def test_the_report_says_why_the_hooks_were_refused(squatted):
    """Issue 23 #1: the hooks probe said only "not started"."""
    path, _spy = squatted
    probe = HookProbe(str(path.parent / "agent-1.sock"), optional=True)
    first = probe.open(Target(0))
    final = probe.final_status()
    probe.close()
    assert not first.available and not final.available
    assert "refused" in final.reason and "uid 65534" in final.reason, final.reason


def test_a_second_agent_on_the_same_job_leaves_the_first_ones_steps(tmp_path):
    """Issue 53 N59: a second attach replaced the first one's socket and took its steps (the
    first reported 5 s of an 18 s look, its hooks status plain `available`)."""
    folder = tmp_path / "gpudiag-me"
    folder.mkdir(mode=0o700)
    path = str(folder / "agent-1.sock")
    first = HookProbe(path, optional=True)
    assert first.open(Target(0)).available
    second = HookProbe(path, optional=True)
    try:
        status = second.open(Target(0))
        assert not status.available and "another gpudiag" in status.reason
        assert second.final_status() == status
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.sendto(datagram(0.25), path)
        assert [s.values["step_time_s"] for s in first.sample()] == [0.25]
    finally:
        second.close()
        first.close()
    assert not os.path.exists(path)


def test_a_socket_left_by_an_agent_that_died_is_replaced(tmp_path):
    """The check above refuses only a live agent: a SIGKILLed one's socket is stale."""
    folder = tmp_path / "gpudiag-me"
    folder.mkdir(mode=0o700)
    path = str(folder / "agent-1.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(path)
    dead.close()  # the file stays, nobody bound
    probe = HookProbe(path, optional=True)
    try:
        assert probe.open(Target(0)).available
    finally:
        probe.close()


def test_a_channel_that_cannot_be_made_says_why_and_leaves_nothing(tmp_path, monkeypatch):
    """Issue 53 N76: under a long TMPDIR the socket's path was too long; the hooks were
    dropped from the report without a word and the gpudiag-XXXX folder was left behind."""
    import tempfile

    long = tmp_path / ("d" * 60) / ("e" * 60)
    long.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    probe = HookProbe()
    status = probe.open(Target(0))
    assert not status.available and "cannot create the hooks' socket" in status.reason
    assert "107 bytes" in (status.hint or "") and "TMPDIR" in (status.hint or "")
    assert probe.final_status() == status
    probe.close()
    assert list(long.iterdir()) == []  # its folder removed


def test_a_probe_closed_while_it_drains_ends_the_drain_without_an_error():
    """The job ends and the session closes the probe while a tick drains it (a calibration
    child can keep one datagram's handling for seconds): the drain stops, never raises
    (it used to stop the probe with "'NoneType' object has no attribute 'recvmsg'")."""
    probe = HookProbe()
    assert probe.open(Target(0)).available
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for _ in range(3):
        sender.sendto(datagram(), probe.path)

    class ClosingCalibrator:
        def on_samples(self, got):
            probe.close()  # as the session's thread would, mid-drain
            return []

        def join(self, timeout=None):
            pass

        def take(self):
            return []

    probe.calibrator = ClosingCalibrator()  # type: ignore[assignment]
    samples = probe.sample()
    assert [s.values["step_time_s"] for s in samples] == [0.5]
    sender.close()
