"""The one place gpudiag opens a connection (issue 53): tests/test_choke_points.py fails on
one opened anywhere else.

A network request goes to an IP address (never a host name to resolve), for a fixed
absolute path (no query, no fragment), without following redirects, bounded in time and in
the size of the answer. Where the address comes from a job (a `tritonserver` command line
names its metrics port), `listens_on` first: only a port that process itself listens on (a
socket in its own fd table) is asked; root's gpudiag must not send requests where a job's
owner points it. A Unix socket is only probed for a live listener (`unix_bound`), never
written to from here.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import stat
import struct
from dataclasses import dataclass

import psutil


def unspecified(host: str) -> bool:
    """Whether an address is empty or every interface's (IPv4's or IPv6's)."""
    try:
        return not host or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False  # a host name


def listens_on(pid: int, host: str, port: int) -> bool:
    """Whether process `pid` itself holds a socket listening on `port` at `host` (or on every
    address): the sockets in its own fd table, not the box's."""
    try:
        conns = psutil.Process(pid).net_connections(kind="inet")
    except (psutil.Error, OSError):
        return False
    for c in conns:
        if c.status != psutil.CONN_LISTEN or not c.laddr or c.laddr.port != port:
            continue
        ip = c.laddr.ip.split("%", 1)[0]
        if ip == host or unspecified(ip):
            return True
    return False


def http_get(host: str, port: int, path: str, timeout_s: float, limit: int) -> bytes:
    """The body of one GET of `path` at `host:port` (HTTP 200 only, no redirect followed, at
    most `limit` bytes); ValueError for an address, port or path that is not one, or an
    answer that is not a whole 200 within the limit; OSError when there is none."""
    ip = str(ipaddress.ip_address(host))  # ValueError for a host name
    if type(port) is not int or not 0 < port < 65536:
        raise ValueError(f"{port!r} is not a port number")
    if not path.startswith("/") or not path.isascii() or any(c in path for c in "?#% \r\n"):
        raise ValueError(f"{path[:40]!r} is not a fixed path")
    conn = http.client.HTTPConnection(ip, port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Accept-Encoding": "identity"})
        r = conn.getresponse()
        if r.status != 200:
            raise ValueError(f"HTTP {r.status}")
        body = r.read(limit + 1)
    finally:
        conn.close()
    if len(body) > limit:
        raise ValueError(f"the answer is over {limit} bytes")
    return body


def unix_bound(path: str) -> bool:
    """Whether a Unix datagram socket at `path` is bound by a live process (a connect
    succeeds; nothing is sent); False for no socket, or one whose owner is gone."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.connect(path)
    except OSError:
        return False
    finally:
        sock.close()
    return True


# The kernel's socket table over netlink (sock_diag, as `ss -ti` reads it): a query to the
# kernel about the box's own TCP sockets, no packet sent anywhere.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_DUMP_REQUEST = 0x301  # NLM_F_REQUEST | NLM_F_DUMP
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_ESTABLISHED = 1
INET_DIAG_INFO = 2
DIAG_MSG_LEN = 72  # struct inet_diag_msg
MAX_DIAG_BYTES = 64 << 20  # of one dump's answers: more is not read


@dataclass(frozen=True)
class TcpConn:
    """One established TCP socket: its local port, its inode, and from the kernel's tcp_info
    the milliseconds since it last received data and since it last sent data."""

    port: int
    inode: int
    since_recv_ms: int
    since_sent_ms: int
    segs_in: int | None = None  # data segments received and sent (kernel 4.6+)
    segs_out: int | None = None

    @property
    def awaiting_answer(self) -> bool:
        """It received data and has sent none since: a request not answered yet. A connection
        that has sent no data at all yet counts on its first data received (its "last sent"
        is its handshake's, often within the same tick as a one-request connection's
        request); a request answered within the same tick reads as answered."""
        if self.segs_in is not None and self.segs_out is not None and self.segs_in > 0:
            if self.segs_out == 0:
                return True
        return self.since_recv_ms < self.since_sent_ms


def tcp_established(ports: frozenset[int]) -> list[TcpConn]:
    """The box's established TCP sockets (IPv4 and IPv6) whose local port is one of `ports`
    (the connections a server accepted on its listening ports); OSError where the kernel
    has no sock_diag or refuses it."""
    out: list[TcpConn] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        out.extend(c for c in _diag_dump(family) if c.port in ports)
    return out


def _diag_dump(family: int) -> list[TcpConn]:
    """One sock_diag dump of a family's established TCP sockets, with their tcp_info."""
    sockid = bytes(48)  # any ports and addresses
    req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, 1 << 1)
    body = req + sockid
    head = struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_DUMP_REQUEST, 1, 0)
    got: list[TcpConn] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(head + body, (0, 0))
        read = 0
        while read < MAX_DIAG_BYTES:
            data = nl.recv(1 << 16)
            read += len(data)
            if not data:
                return got
            done = _parse_diag(data, got)
            if done:
                return got
    return got


def _parse_diag(data: bytes, got: list[TcpConn]) -> bool:
    """Append the sockets of one netlink read to `got`; True at the dump's end."""
    off = 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        if length < 16:
            return True
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            raise OSError("sock_diag: the kernel refused the dump")
        if length >= 16 + DIAG_MSG_LEN:
            conn = _conn_of(data[off + 16 : off + length])
            if conn is not None:
                got.append(conn)
        off += (length + 3) & ~3
    return False


def _conn_of(msg: bytes) -> TcpConn | None:
    """A TcpConn from one inet_diag_msg and its attributes (None without tcp_info)."""
    (port,) = struct.unpack_from("!H", msg, 4)
    (inode,) = struct.unpack_from("=I", msg, 68)
    off = DIAG_MSG_LEN
    while off + 4 <= len(msg):
        alen, atype = struct.unpack_from("=HH", msg, off)
        if alen < 4:
            return None
        if atype == INET_DIAG_INFO and alen - 4 >= 56:
            sent, _ack, recv = struct.unpack_from("=III", msg, off + 4 + 44)
            segs: tuple[int | None, int | None] = (None, None)
            if alen - 4 >= 160:  # tcpi_data_segs_in, tcpi_data_segs_out
                segs = struct.unpack_from("=II", msg, off + 4 + 152)
            return TcpConn(port, inode, recv, sent, *segs)
        off += (alen + 3) & ~3
    return None
