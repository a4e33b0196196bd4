"""Connections probe: a server's requests in flight, read from the kernel without the hooks.

The job's processes (the target, its front end and their children) and the TCP ports they
listen on; each tick, the established connections accepted on those ports (the kernel's
sock_diag, as `ss -ti` reads it) and how many of them received data after they last sent
any: a request read and not answered yet. Requests an event loop holds while they wait for
a thread pool are on no thread's stack (BentoML's sync API, FastAPI's `def` endpoints); the
kernel still sees them in flight. Nothing is sent to the server.
"""

from __future__ import annotations

import psutil

from gpudiag.probes.base import Field, Probe, ProbeStatus, Sample, Target, now_ns
from gpudiag.probes.files import descendants
from gpudiag.probes.net import tcp_established

FIND_EVERY_S = 2.0  # how often to look again for listening ports (a server binds late)...
FIND_FOR_S = 60.0  # ...for this long after the look starts, while none is found (each look
# reads every process's socket table: a job that serves nothing stops paying for it)
MAX_PORTS = 64  # listening ports followed: more are not read


def listening_ports(root: int) -> frozenset[int]:
    """The TCP ports `root` and its descendants listen on (their own fd tables; the
    descendants from each thread's children file: psutil's children() reads the stat of every
    process on the box, and each watched job's look ran it every 2 s)."""
    ports: set[int] = set()
    for pid in (root, *descendants(root)):
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except (psutil.Error, OSError):
            continue
        ports.update(c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr)
    return frozenset(sorted(ports)[:MAX_PORTS])


class ConnectionsProbe(Probe):
    """The connections a server of the job accepted, and those awaiting an answer, per tick."""

    name = "conns"
    interval_s = 0.5
    fields = (
        Field("open", "count", "gauge", "established connections on the job's listening ports"),
        Field(
            "in_flight",
            "count",
            "gauge",
            "of them, those that received data after they last sent any (a request unanswered)",
        ),
        Field("busy", "ratio", "gauge", "1 when at least one request was unanswered at the tick"),
    )

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s = interval_s
        self._roots: tuple[int, ...] = ()
        self.ports: frozenset[int] = frozenset()
        self._next_find = 0.0
        self._give_up = 0.0
        self._off: str | None = None
        self._errors: list[str] = []

    def open(self, target: Target) -> ProbeStatus:
        """Find the job's listening ports now; a server that binds later is looked for again."""
        self._roots = (target.pid,) + ((target.server,) if target.server is not None else ())
        self._give_up = now_ns() / 1e9 + FIND_FOR_S
        self._find()
        return ProbeStatus(self.name, True)

    def applies(self) -> bool:
        """Whether the job listens on a TCP port (a job that serves nothing is not reported)."""
        return bool(self.ports) or self._off is not None

    def _find(self) -> None:
        """The ports the target's own tree listens on (a model worker's shared socket, not
        its front end's other ports); else its front end's."""
        self._next_find = now_ns() / 1e9 + FIND_EVERY_S
        for root in self._roots:
            found = listening_ports(root)
            if found:
                self.ports = found
                return

    def sample(self) -> list[Sample]:
        """One reading of the connections on the job's listening ports."""
        if self._off is not None:
            return []
        now = now_ns() / 1e9
        if not self.ports and self._next_find <= now < self._give_up:
            self._find()
        if not self.ports:
            return []
        t = now_ns()
        try:
            conns = tcp_established(self.ports)
        except OSError as exc:  # no sock_diag in this kernel, or refused
            self._off = f"the kernel's socket table could not be read: {exc}"
            self._errors.append(self._off)
            return []
        waiting = sum(c.awaiting_answer for c in conns)
        values: dict[str, float | None] = {
            "open": float(len(conns)),
            "in_flight": float(waiting),
            "busy": float(waiting > 0),
        }
        return [Sample(self.name, t, {}, values)]

    def problems(self) -> list[str]:
        """Why the connections stopped being read, once."""
        out, self._errors = self._errors, []
        return out

    def final_status(self) -> ProbeStatus | None:
        """Unavailable where the kernel's socket table could not be read."""
        return ProbeStatus(self.name, False, self._off) if self._off is not None else None

    def close(self) -> None:
        """Nothing held between ticks."""
        return None
