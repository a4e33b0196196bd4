"""The choke points of processes and connections (probes/spawn.py, probes/net.py) refuse what
root must never do on a job's word; tests/test_choke_points.py holds every call to them."""

from __future__ import annotations

import http.server
import os
import threading

import pytest

from gpudiag.probes.net import http_get, listens_on, unix_bound
from gpudiag.probes.spawn import SpawnRefused, run_process, start_process


@pytest.mark.parametrize(
    "argv",
    [
        [f"/proc/{os.getpid()}/exe", "-I", "-S", "-c", "print(1)"],  # issue 53 V01
        ["/proc/self/exe"],
        ["/proc/../proc/1/exe"],
        "python3 -c 'print(1)'",
        [],
        ["py-spy", 3],
    ],
)
def test_the_spawner_refuses_a_job_binary_a_shell_line_or_no_argv(argv):
    with pytest.raises(SpawnRefused):
        start_process(argv)
    with pytest.raises(SpawnRefused):
        run_process(argv, capture_output=True)


def test_the_spawner_refuses_a_shell_or_another_executable():
    with pytest.raises(SpawnRefused, match="shell"):
        run_process(["id"], shell=True)
    with pytest.raises(SpawnRefused, match="executable"):
        start_process(["python3"], executable=f"/proc/{os.getpid()}/exe")


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        if self.path == "/metrics":
            body = b"x" * 100
            self.send_response(200)
        else:
            body = b""
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:1/metrics")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_a_request_goes_to_an_ip_for_a_fixed_path_bounded(server):
    assert http_get("127.0.0.1", server, "/metrics", 5.0, 1000) == b"x" * 100
    with pytest.raises(ValueError, match="over 50 bytes"):
        http_get("127.0.0.1", server, "/metrics", 5.0, 50)
    with pytest.raises(ValueError, match="HTTP 302"):  # a redirect is not followed
        http_get("127.0.0.1", server, "/elsewhere", 5.0, 1000)
    with pytest.raises(ValueError):  # a host name is never resolved
        http_get("localhost", server, "/metrics", 5.0, 1000)
    for path in ("/internal/admin?token=x&q=/metrics", "metrics", "/a b", "/%2e%2e"):
        with pytest.raises(ValueError, match="not a fixed path"):  # issue 53 V03's shape
            http_get("127.0.0.1", server, path, 5.0, 1000)


def test_only_a_port_the_process_itself_listens_on_is_its_own(server):
    assert listens_on(os.getpid(), "127.0.0.1", server)
    assert not listens_on(os.getpid(), "127.0.0.2", server)
    assert not listens_on(os.getpid(), "127.0.0.1", server + 1 if server < 65535 else 1)
    assert not listens_on(1, "127.0.0.1", server)  # not init's socket


def test_a_unix_socket_is_bound_only_while_its_owner_holds_it(tmp_path):
    import socket

    path = str(tmp_path / "s.sock")
    assert not unix_bound(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    assert unix_bound(path)
    s.close()
    assert not unix_bound(path)  # the file is left, nobody holds it
