"""In-process collective hooks: torch.distributed calls counted per rank, sent to the agent.

Runs inside the job beside gpudiag_hooks (which installs it when torch is imported) and
imports nothing from gpudiag. Each collective called through `torch.distributed`
(all_reduce, reduce_scatter, all_gather, barrier, broadcast and their tensor variants) gets a
sequence number (one counter for every collective of the process, like NCCL's per-group
sequence) and the host time spent inside the call. DDP's C++ reducer does not call these
Python functions: a timing communication hook (`register_comm_hook`, wrapping DDP's default
all-reduce) is installed on each DistributedDataParallel at its first forward, so the gradient
all-reduce is timed too, from the bucket handed over until its future completes. A hook the
user registers is wrapped the same way; a built-in C++ hook cannot be, and the datagram says so.

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
from collections.abc import Callable
from typing import Any

try:
    from . import gpudiag_channel as _channel
except ImportError:  # loaded as a top-level module by sitecustomize
    import gpudiag_channel as _channel

CHANNEL_ENV = _channel.CHANNEL_ENV

SEND_S = 0.5
MAX_STEP_ROWS = 256
COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",  # FSDP's all-gather (torch 2.10+ name)
    "reduce_scatter_single",  # FSDP's gradient reduce-scatter
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
        self.open: dict[int, tuple[str, float]] = {}  # seq -> (name, wall time entered)
        self.open_since = 0.0  # perf_counter when the first of the open collectives began
        self.ddp: dict[str, str] = {}  # how DDP's all-reduce is timed: hook -> state
        self.local = threading.local()  # .hook set while a timed DDP hook runs
        self.step_time = 0.0  # seconds inside collectives since the last optimizer step
        self.step_calls = 0
        self.steps: list[list[float]] = []  # [wall time, collective s, calls, last seq, step s]
        self.last_step = 0.0  # wall time of the last optimizer step
        self.sent = 0
        self.thread: threading.Thread | None = None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.ranks = {k.lower(): os.environ[k] for k in RANK_VARS if k in os.environ}

    def enter(self, name: str) -> int:
        with self.lock:
            self.seq += 1
            if not self.open:
                self.open_since = time.perf_counter()
            self.open[self.seq] = (name, time.time())
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="gpudiag-dist", daemon=True)
                self.thread.start()
            return self.seq

    def leave(self, name: str, seconds: float, seq: int | None = None) -> None:
        """One collective finished; the step's time inside collectives is the union of the
        open ones (DDP's buckets overlap), not their sum."""
        with self.lock:
            self.done += 1
            self.open.pop(seq if seq is not None else max(self.open, default=0), None)
            if not self.open:
                self.step_time += time.perf_counter() - self.open_since
            op = self.ops.setdefault(name, [0.0, 0.0])
            op[0] += 1
            op[1] += seconds
            self.step_calls += 1

    def on_step(self) -> None:
        with self.lock:
            now = time.time()
            if len(self.steps) < MAX_STEP_ROWS:  # the step's own length rides along, so a
                # lost datagram loses a step's collectives and its length together
                step_s = now - self.last_step if self.last_step else 0.0
                self.steps.append([now, self.step_time, self.step_calls, self.seq, step_s])
            self.last_step = now
            self.step_time = 0.0
            self.step_calls = 0

    def message(self) -> dict:
        with self.lock:
            first = min(self.open, default=None)  # the oldest collective not yet completed
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
                        if first is None
                        else {
                            "op": self.open[first][0],
                            "seq": first,
                            "since_s": time.time() - self.open[first][1],
                        }
                    ),
                    "ddp": dict(self.ddp),
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


def _wrap(
    dist: _Dist,
    name: str,
    orig: Callable[..., Any],
    compiling: Callable[[], bool] = lambda: False,
) -> Callable[..., Any]:
    def collective(*args: Any, **kwargs: Any) -> Any:
        if compiling() or getattr(dist.local, "hook", False):
            return orig(*args, **kwargs)  # traced by torch.compile, or inside a timed DDP hook
        seq = dist.enter(name)
        t0 = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            dist.leave(name, time.perf_counter() - t0, seq)

    collective.__wrapped__ = orig  # type: ignore[attr-defined]  # a function attribute
    collective.__name__ = getattr(orig, "__name__", name)
    collective.__doc__ = getattr(orig, "__doc__", None)
    return collective


def install(torch: Any, channel: str | None = None) -> bool:
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
        wrapped.__gpudiag__ = True  # type: ignore[attr-defined]  # our mark on the wrapper
        setattr(tdist, name, wrapped)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    st = _dist
    register_optimizer_step_post_hook(lambda opt, args, kwargs: st.on_step())
    atexit.register(lambda: st.send() if st.thread is not None else None)
    try:
        _install_ddp(st)
    except Exception:  # DDP's internals moved: the stacks still see backward
        st.ddp["install"] = "failed"
    return True


# ---- DDP: a timing communication hook --------------------------------------------------
DDP_OP = "ddp_allreduce"


def timed_hook(st: _Dist, hook: Callable[..., Any], name: str = DDP_OP) -> Callable[..., Any]:
    """A DDP communication hook that times `hook`: entered when DDP hands it a bucket,
    left when the future it returns completes (or fails)."""
    import functools

    @functools.wraps(hook)
    def timed(state, bucket):
        seq = st.enter(name)
        t0 = time.perf_counter()
        st.local.hook = True  # the hook's own dist.all_reduce is this collective
        try:
            fut = hook(state, bucket)
        except BaseException:
            st.leave(name, time.perf_counter() - t0, seq)
            raise
        finally:
            st.local.hook = False

        def done(f):
            st.leave(name, time.perf_counter() - t0, seq)
            return f.value()

        return fut.then(done)

    timed.__gpudiag__ = True  # type: ignore[attr-defined]  # our mark on the wrapper
    return timed


def _install_ddp(st: _Dist) -> None:
    """Patch DistributedDataParallel: its first forward registers a timing hook around the
    default all-reduce unless the user registered a hook; a user's Python hook is wrapped."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    if getattr(DDP, "__gpudiag__", False):
        return
    orig_register = DDP.register_comm_hook
    orig_builtin = DDP._register_builtin_comm_hook
    orig_pre = DDP._pre_forward

    def register_comm_hook(self, state, hook):
        if getattr(hook, "__gpudiag__", False):
            return orig_register(self, state, hook)
        name = getattr(hook, "__qualname__", "hook")
        if not name.startswith("_reducer_allreduce"):  # DDP's own mixed-precision hook
            st.ddp["hook"] = f"user: {name[:60]}, timed by wrapping it"
        box = getattr(self, "_gpudiag_box", None)
        if box is not None:  # ours is registered (DDP takes one): route to the user's hook
            self._check_comm_hook(hook)
            box[0] = (hook, state)
            self._comm_hooks.append((hook, state))
            return None
        return orig_register(self, state, timed_hook(st, hook))

    def register_builtin(self, comm_hook_type):
        self._gpudiag_builtin = True
        st.ddp["hook"] = f"user builtin {comm_hook_type}: not timed (C++), the wait is inferred"
        return orig_builtin(self, comm_hook_type)

    def pre_forward(self, *inputs, **kwargs):
        if not getattr(self, "_gpudiag_seen", False):
            self._gpudiag_seen = True
            python_reducer = getattr(self, "_use_python_reducer", False)
            if not self._comm_hooks and not getattr(self, "_gpudiag_builtin", False):
                if not python_reducer:
                    box = [(allreduce_hook, None)]  # a hook registered later replaces it

                    def dispatch(state, bucket, box=box):
                        hook, hook_state = box[0]
                        return hook(hook_state, bucket)

                    orig_register(self, None, timed_hook(st, dispatch))
                    self._gpudiag_box = box
                    self._comm_hooks.clear()  # the user may still register theirs
                    st.ddp.setdefault("hook", "timing hook around DDP's default all-reduce")
        return orig_pre(self, *inputs, **kwargs)

    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = register_builtin
    DDP._pre_forward = pre_forward
    DDP.__gpudiag__ = True  # type: ignore[attr-defined]  # our mark on torch's class
