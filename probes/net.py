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
