"""The connections probe: a server's requests in flight from the kernel's socket table
(sock_diag), without the hooks: a connection that received a request and has not answered
it is in flight; one answered, or idle, is not."""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.net import TcpConn, _parse_diag, tcp_established
from gpudiag.probes.servers.connections import ConnectionsProbe

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_NETLINK"), reason="Linux only")


def _pair(srv: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    return client, conn


def test_a_request_read_and_not_answered_is_in_flight_until_its_answer():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    probe = ConnectionsProbe()
    try:
        assert probe.open(Target(os.getpid())).available
        assert port in probe.ports and probe.applies()
        idle_client, idle_conn = _pair(srv)  # a connection with nothing asked yet
        asked_client, asked_conn = _pair(srv)
        time.sleep(0.02)
        asked_client.sendall(b"POST /predict HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        time.sleep(0.02)
        (s,) = probe.sample()
        assert s.values == {"open": 2.0, "in_flight": 1.0, "busy": 1.0}
        conns = {c.inode: c for c in tcp_established(frozenset({port}))}
        asked = conns[os.fstat(asked_conn.fileno()).st_ino]
        assert asked.awaiting_answer and asked.segs_out == 0
        asked_conn.recv(100)  # read by the server: still unanswered
        assert probe.sample()[0].values["in_flight"] == 1.0
        asked_conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        time.sleep(0.02)
        assert probe.sample()[0].values == {"open": 2.0, "in_flight": 0.0, "busy": 0.0}
        # the next request on the kept-alive connection is in flight again
        time.sleep(0.01)
        asked_client.sendall(b"POST /predict HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        time.sleep(0.02)
        assert probe.sample()[0].values["in_flight"] == 1.0
        for s in (idle_client, idle_conn, asked_client, asked_conn):
            s.close()
    finally:
        srv.close()
        probe.close()


def test_a_job_listening_on_no_port_is_not_reported():
    probe = ConnectionsProbe()
    assert probe.open(Target(os.getpid())).available
    if probe.ports:  # another test's listener in this process
        pytest.skip("this process listens on a port")
    assert probe.sample() == [] and not probe.applies()


def _msg(port: int, inode: int, info: bytes) -> bytes:
    """One inet_diag_msg with its tcp_info attribute, in a netlink header."""
    diag = struct.pack("=BBBB", 2, 1, 0, 0) + struct.pack("!HH", port, 40000) + bytes(44)
    diag += struct.pack("=IIIII", 0, 0, 0, 0, inode)
    attr = struct.pack("=HH", 4 + len(info), 2) + info
    body = diag + attr + bytes(-len(attr) % 4)
    return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body


def test_the_kernels_answer_is_read_with_or_without_the_data_segment_counts():
    """tcp_info grew over kernels: without tcpi_data_segs_in/out (before 4.6) the last
    send and receive times alone say whether a request waits."""
    full = bytearray(232)
    struct.pack_into("=III", full, 44, 50, 0, 10)  # sent 50 ms ago, received 10 ms ago
    struct.pack_into("=II", full, 152, 1, 0)
    short = bytearray(104)
    struct.pack_into("=III", short, 44, 5, 0, 5)
    data = _msg(8000, 11, bytes(full)) + _msg(8000, 12, bytes(short))
    done = struct.pack("=IHHII", 20, 3, 2, 1, 0) + bytes(4)
    got: list[TcpConn] = []
    assert _parse_diag(data + done, got) is True
    assert got == [TcpConn(8000, 11, 10, 50, 1, 0), TcpConn(8000, 12, 5, 5)]
    assert got[0].awaiting_answer and not got[1].awaiting_answer
    err = struct.pack("=IHHII", 20, 2, 0, 1, 0) + bytes(4)
    with pytest.raises(OSError):
        _parse_diag(err, [])
