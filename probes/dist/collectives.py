"""The agent's side of the collective hooks (probes/inject/gpudiag_dist.py): their datagrams
turned into samples, each process's latest collective state kept for the hang check, and the
hooks' samples labelled with the rank that sent them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gpudiag.probes.numbers import finite_number
from gpudiag.probes.base import Field, Sample

FIELDS = (
    Field("collective_s", "s", "gauge", "host time inside torch.distributed collectives in a step"),
    Field("collectives", "count", "gauge", "collectives called in a step"),
    Field("seq", "count", "gauge", "collectives the rank started so far (its sequence number)"),
    Field("collective_step_s", "s", "gauge", "the step's length, sent with its collective time"),
    Field("calls", "count", "gauge", "calls of one collective so far"),
    Field("collective_time_s", "s", "gauge", "host time inside one collective so far"),
)


@dataclass(frozen=True)
class CollectiveState:
    """What one rank's hooks said last: its sequence, the collective it is inside."""

    pid: int
    rank: int | None
    seq: int
    done: int
    inside_op: str | None
    inside_seq: int | None
    inside_s: float | None
    received: float  # monotonic time the agent got it
    ddp_hook: str | None = None  # how DDP's gradient all-reduce is timed, in words


def _num(v: object) -> float | None:
    """A finite number of a datagram (None for anything else: NaN, 1e400, a string)."""
    if not isinstance(v, (int, float)):
        return None
    try:
        return finite_number(v)
    except (ValueError, OverflowError):
        return None


def _time(v: object) -> float | None:
    """A time in epoch seconds (None past 1e10 s: not a time the hooks sent)."""
    t = _num(v)
    return t if t is not None and abs(t) <= 1e10 else None


def _rank(v: object) -> int | None:
    """A rank: ASCII digits only ('²' is a digit to str.isdigit, not to int)."""
    text = str(v)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None


def parse_dist(msg: dict) -> tuple[list[Sample], CollectiveState | None]:
    """Samples and the state from one collective datagram (`msg["dist"]`)."""
    d = msg.get("dist")
    if not isinstance(d, dict):
        return [], None
    out: list[Sample] = []
    for row in d.get("steps") or []:
        if not isinstance(row, list) or len(row) not in (4, 5) or any(_num(v) is None for v in row):
            continue
        if _time(row[0]) is None:
            continue
        vals: dict[str, float | None] = {"collective_s": float(row[1]), "collectives": float(row[2]), "seq": float(row[3])}
        kind = "collective_step"
        if len(row) == 5:  # the step's length too; 0 for the first step (start-up, apart)
            if float(row[4]) > 0:
                vals["collective_step_s"] = float(row[4])
            else:
                kind = "collective_first_step"
        out.append(Sample("hooks", int(float(row[0]) * 1e9), {"kind": kind}, vals))
    t = int((_time(d.get("t")) or time.time()) * 1e9)
    for op, vals in (d.get("ops") or {}).items():
        if isinstance(vals, list) and len(vals) == 2 and all(_num(v) is not None for v in vals):
            out.append(
                Sample(
                    "hooks",
                    t,
                    {"kind": "collective_op", "op": str(op)[:64]},
                    {"calls": float(vals[0]), "collective_time_s": float(vals[1])},
                )
            )
    env = d.get("env")
    env = env if isinstance(env, dict) else {}
    inside = d.get("inside") if isinstance(d.get("inside"), dict) else None
    pid = msg.get("pid")
    state = CollectiveState(
        pid=int(pid) if isinstance(pid, int) else 0,
        rank=_rank(env.get("rank", "")),
        seq=int(_num(d.get("seq")) or 0),
        done=int(_num(d.get("done")) or 0),
        inside_op=str(inside.get("op"))[:64] if inside else None,
        inside_seq=int(_num(inside.get("seq")) or 0) if inside else None,
        inside_s=_num(inside.get("since_s")) if inside else None,
        received=time.monotonic(),
        ddp_hook=str((d.get("ddp") or {}).get("hook"))[:120]
        if isinstance(d.get("ddp"), dict) and (d.get("ddp") or {}).get("hook")
        else None,
    )
    return out, state


class RankLabels:
    """pid -> rank, learned from rank discovery and from the hooks' own environment; the
    latest collective state and last step per rank (for the hang check)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ranks: dict[int, int] = {}
        self.states: dict[int, CollectiveState] = {}  # by rank
        self.last_step: dict[int, float] = {}  # rank -> monotonic time of its last step
        self.steps: dict[int, int] = {}
        self.step_ns: dict[int, int] = {}  # rank -> its last step's time (ns, the job's clock)
        self.longest: dict[int, float] = {}  # rank -> its longest interval between steps (s)
        self.enabled = False  # label only when the session follows ranks (agent.ranks)

    def tag(self, msg: dict, samples: list[Sample]) -> list[Sample]:
        """The samples of one datagram, labelled with the sender's rank when it is known."""
        pid = msg.get("pid")
        state = None
        if "dist" in msg:
            extra, state = parse_dist(msg)
            samples = samples + extra
        if not self.enabled:
            return samples
        with self.lock:
            if state is not None and state.rank is not None and isinstance(pid, int):
                self.ranks.setdefault(pid, state.rank)
            rank = self.ranks.get(pid) if isinstance(pid, int) else None
            if rank is None:
                return samples
            if state is not None:
                self.states[rank] = state
            times = sorted(s.t_ns for s in samples if s.labels.get("kind") == "step")
            n = len(times)
            for t in times:
                prev = self.step_ns.get(rank)
                if prev is not None and t > prev:
                    self.longest[rank] = max(self.longest.get(rank, 0.0), (t - prev) / 1e9)
                self.step_ns[rank] = t
            if n:
                self.steps[rank] = self.steps.get(rank, 0) + n
                self.last_step[rank] = time.monotonic()
        label = str(rank)
        return [Sample(s.probe, s.t_ns, {**s.labels, "rank": label}, s.values) for s in samples]
