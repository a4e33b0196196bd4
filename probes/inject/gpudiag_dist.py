"""In-process collective hooks: torch.distributed calls counted per rank, sent to the agent.

Runs inside the job beside gpudiag_hooks (which installs it when torch is imported) and
imports nothing from gpudiag. Each collective called through `torch.distributed`
(all_reduce, reduce_scatter, all_gather, barrier, broadcast and their tensor variants) gets a
sequence number (one counter for every collective of the process, like NCCL's per-group
sequence) and the host time spent inside the call. DDP's C++ reducer does not call these
Python functions: its all-reduce is seen only from the stacks (inside `backward`).

A daemon thread sends one datagram every SEND_S seconds once the job made its first
collective: the totals per collective, the time inside collectives per optimizer step, and
the collective the job is inside right now (name, sequence number, since when). That last
part is what lets the agent explain a hang while the job is hung: no step ends then, so no
step-driven message would ever leave the job. Sends never block and are dropped when the
agent is gone.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time

try:
    from . import gpudiag_channel as _channel
except ImportError:  # loaded as a top-level module by sitecustomize
    import gpudiag_channel as _channel

CHANNEL_ENV = "GPUDIAG_CHANNEL"
SEND_S = 0.5
MAX_STEP_ROWS = 256
COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "reduce",
)
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")


class _Dist:
    """Counters of one process's collectives and the sender thread."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.seq = 0  # collectives started
        self.done = 0  # collectives finished
        self.ops: dict[str, list[float]] = {}  # name -> [calls, seconds]
        self.inside: tuple[str, int, float] | None = None  # name, seq, wall time entered
        self.step_time = 0.0  # seconds inside collectives since the last optimizer step
        self.step_calls = 0
        self.steps: list[list[float]] = []  # [wall time, collective s, calls, last seq]
        self.sent = 0
        self.thread: threading.Thread | None = None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.ranks = {k.lower(): os.environ[k] for k in RANK_VARS if k in os.environ}

    def enter(self, name: str) -> int:
        with self.lock:
            self.seq += 1
            self.inside = (name, self.seq, time.time())
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="gpudiag-dist", daemon=True)
                self.thread.start()
            return self.seq

    def leave(self, name: str, seconds: float) -> None:
        with self.lock:
            self.done += 1
            self.inside = None
            op = self.ops.setdefault(name, [0.0, 0.0])
            op[0] += 1
            op[1] += seconds
            self.step_time += seconds
            self.step_calls += 1

    def on_step(self) -> None:
        with self.lock:
            if len(self.steps) < MAX_STEP_ROWS:
                self.steps.append([time.time(), self.step_time, self.step_calls, self.seq])
            self.step_time = 0.0
            self.step_calls = 0

    def message(self) -> dict:
        with self.lock:
            msg = {
                "v": 2,
                "pid": os.getpid(),
                "dist": {
                    "env": self.ranks,
                    "seq": self.seq,
                    "done": self.done,
                    "ops": {k: list(v) for k, v in self.ops.items()},
                    "steps": self.steps,
                    "inside": (
                        None
                        if self.inside is None
                        else {
                            "op": self.inside[0],
                            "seq": self.inside[1],
                            "since_s": time.time() - self.inside[2],
                        }
                    ),
                    "t": time.time(),
                },
            }
            self.steps = []
        return msg

    def send(self) -> None:
        path = self.path or os.path.join(
            os.environ.get("XDG_RUNTIME_DIR") or "/tmp",
            f"gpudiag-{os.getuid()}",
            f"agent-{os.getpid()}.sock",
        )
        data = json.dumps(self.message(), separators=(",", ":")).encode()
        if not _channel.private_path(path):
            return  # someone else's folder: never hand them the job's collectives
        try:
            self.sock.sendto(data, path)
            self.sent += 1
        except OSError:
            pass  # no agent, agent gone, buffer full: drop, never wait

    def _run(self) -> None:
        while True:
            time.sleep(SEND_S)
            self.send()


_dist: _Dist | None = None


def _wrap(dist: _Dist, name: str, orig, compiling=lambda: False):
    def collective(*args, **kwargs):
        if compiling():  # traced by torch.compile: stay out of its graph
            return orig(*args, **kwargs)
        dist.enter(name)
        t0 = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            dist.leave(name, time.perf_counter() - t0)

    collective.__wrapped__ = orig  # type: ignore[attr-defined]
    collective.__name__ = getattr(orig, "__name__", name)
    collective.__doc__ = getattr(orig, "__doc__", None)
    return collective


def install(torch, channel: str | None = None) -> bool:
    """Wrap torch.distributed's collectives and count optimizer steps; False when the job's
    torch has no torch.distributed."""
    global _dist
    if _dist is not None:
        return True
    try:
        import torch.distributed as tdist
    except Exception:
        return False
    if not getattr(tdist, "is_available", lambda: False)():
        return False
    _dist = _Dist(channel or os.environ.get(CHANNEL_ENV))
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
    for name in COLLECTIVES:
        orig = getattr(tdist, name, None)
        if orig is None or hasattr(orig, "__gpudiag__"):
            continue
        wrapped = _wrap(_dist, name, orig, compiling)
        wrapped.__gpudiag__ = True  # type: ignore[attr-defined]
        setattr(tdist, name, wrapped)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    st = _dist
    register_optimizer_step_post_hook(lambda opt, args, kwargs: st.on_step())
    atexit.register(lambda: st.send() if st.thread is not None else None)
    return True
