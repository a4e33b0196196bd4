"""In-process hooks: exact step timing inside the job, sent to the gpudiag agent.

Runs inside the training job and imports nothing from gpudiag (the job may use another
environment). What it measures, per optimizer step (PyTorch's global step hooks):
the step's wall time, the time spent waiting in DataLoader iteration, the batch size, and,
on CUDA only, host-to-device copy time (pinned or not) and host-device syncs (`.item()`,
`.cpu()`, `.tolist()`, `torch.cuda.synchronize`) with their call sites; every 2 s the CUDA
caching allocator's statistics and the debugging switches left on (anomaly detection). For
inference and serving (gpudiag_serve.py): each outermost model forward (time, batch size,
autograd on) and each request of an HTTP server.

The channel is a Unix datagram socket the agent created in a private folder. Writes never
block: when the agent is gone or slow, events are dropped and the job loses no time. Hooks
loaded by `attach --hooks` (gpudiag_attach) go quiet once the agent is gone: the DataLoader
class put back, the global forward hooks taken out, no timing, nothing sent, until the next
attach wakes them.
Steps are buffered and sent every 0.1 s, so a step costs a few microseconds.
"""

from __future__ import annotations

import atexit
import errno
import json
import math
import os
import socket
import sys
import threading
import time
from array import array
from collections.abc import Callable
from typing import Any

FLUSH_S = 0.1
MEM_EVERY_S = 2.0
SITE_EVERY = 16  # record the call site of one sync in this many
MAX_ROWS = 512  # steps per datagram (36 KiB), well under the socket's limits
SERVE_ROWS = 1000  # forwards or requests per datagram (about 40 KiB)
# at exit, rows the agent's full queue refused are offered again for at most this long: the
# agent may be busy for a moment (a busy box), and what the job leaves unsent at exit is lost
EXIT_WAIT_S = 3.0
QUIET_AFTER_S = 3.0  # hooks loaded by attach --hooks go quiet once the agent is gone this long
GONE = (errno.ENOENT, errno.ECONNREFUSED)  # no socket, or no agent bound to it any more
# the agent's socket is there but its queue is full (a Unix datagram socket queues at most
# net.unix.max_dgram_qlen datagrams, 10 by default, whatever their size): a front end's and
# a worker's hooks each flushing every 0.1 s filled it between two 0.5 s reads on a busy box
FULL = (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS)
try:
    from . import gpudiag_channel as _channel
    from . import gpudiag_serve as _serve
except ImportError:  # loaded as a top-level module by sitecustomize
    import gpudiag_channel as _channel
    import gpudiag_serve as _serve

CHANNEL_ENV = _channel.CHANNEL_ENV
STEP_WIDTH = _channel.STEP_WIDTH

RUNTIME_DIR = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"gpudiag-{os.getuid()}")


def attach_path(pid: int) -> str:
    """Where `gpudiag attach PID` puts its socket for an instrument()-ed job."""
    return os.path.join(RUNTIME_DIR, f"agent-{pid}.sock")


def private_folder(folder: str) -> bool:
    """Whether the channel's folder is private to this user (gpudiag_channel's one check)."""
    return _channel.folder_problem(folder) is None


class _Channel:
    """Non-blocking datagram sender to the agent's socket."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.sent = 0
        self.dropped = 0
        self.gone_since: float | None = None  # the agent's socket gone (not merely full)
        self.full = False  # the last send found the agent's queue full: rows kept for later
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    def send(self, payload: dict, rows: array | None = None) -> bool:
        """One datagram: a JSON header line, then the step rows as packed doubles."""
        data = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
        if rows is not None:
            data += rows.tobytes()
        if self.path is not None:
            return self._send_to(self.path, data)
        # instrument(): `gpudiag attach` of this process, else of its parent (a server's
        # master, e.g. gunicorn's, attached to while its forked workers serve)
        if self._send_to(attach_path(os.getpid()), data, quiet=True):
            return True
        parent = os.getppid()
        return parent > 1 and self._send_to(attach_path(parent), data)

    def _send_to(self, path: str, data: bytes, quiet: bool = False) -> bool:
        """`data` to the socket at `path`; `quiet`: a miss is not counted (another path is
        tried after it)."""
        if not private_folder(os.path.dirname(path)):
            self.dropped += 1  # someone else's folder: never hand them the job's data
            return False
        try:
            self._sock.sendto(data, path)
        except OSError as exc:  # no agent, agent gone, buffer full: never wait
            if quiet and exc.errno in GONE:
                return False
            self.full = exc.errno in FULL
            if self.full:
                return False  # not dropped: the caller keeps its rows for the next flush
            self.dropped += 1
            if exc.errno in GONE and self.gone_since is None:
                self.gone_since = time.monotonic()
            return False
        self.sent += 1
        self.gone_since = None
        self.full = False
        return True

    def gone_for(self) -> float:
        """Seconds since the agent's socket went away (0 while it is there)."""
        return 0.0 if self.gone_since is None else time.monotonic() - self.gone_since


class _State:
    """What the hooks accumulate between steps, and the buffered steps to send."""

    def __init__(self, channel: _Channel, attached: bool = False) -> None:
        self.channel = channel
        self.attached = attached  # loaded by attach --hooks: quiet once the agent is gone
        self.partial = attached  # loaded mid-run: the first step seen is only partly seen
        self.last_step: float | None = None
        self.loop_start: float | None = None
        self.data_wait = 0.0
        self.batch = 0
        self.h2d = 0.0
        self.pinned = 0
        self.pageable = 0
        self.syncs = 0
        self.sync_time = 0.0
        self.sites: dict[str, int] = {}
        self.pending = array("d")  # STEP_WIDTH doubles a step; NaN = not measured
        self.last_flush = time.perf_counter()
        self.last_mem = 0.0
        self.last_switches = 0.0
        self.cuda = False
        self.torch = None
        self.serve = _serve.Recorder(self.maybe_flush)  # forwards and requests
        self._flushing = threading.Lock()
        self.quiet = False  # attach --hooks, the agent gone: no timing, no sending
        self.patches: list[tuple[type, str, object, object]] = []  # (class, name, orig, ours)
        self.step_calls: list = []  # more calls of our one step hook (attach: the capture's)
        self.step_handle: Any = None  # that global optimizer post hook's handle, while in
        self.compute: Any = None  # gpudiag_compute.Sampler: where sampled steps' compute goes

    def go_quiet(self) -> None:
        """The agent is gone: put the job's classes back, take the global forward hooks
        (gpudiag_serve.go_quiet) and the step hook out and stop timing steps. A later
        attach --hooks wakes them (`wake`)."""
        self.quiet = True
        if self.compute is not None:
            try:
                self.compute.cancel()
            except Exception:  # never break the job
                pass
        for cls, name, orig, _ in self.patches:
            setattr(cls, name, orig)
        self.pending = array("d")
        self.sites = {}
        try:
            _serve.go_quiet(self.serve)
        except Exception:  # never break the job: the hooks stay in, recording nothing
            self.serve.quiet = True
        try:
            self._take_out_step_hook()
        except Exception:  # it stays in, returning at once
            pass

    def _take_out_step_hook(self) -> None:
        """Our global optimizer post hook out when it is the dict's only entry: torch walks
        that dict itself after each step (in any thread), and an entry taken out ahead of a
        walk breaks its next turn, but a walk has always passed a dict's only entry. With the
        job's own global step hooks there (or gpudiag_dist's) it stays, returning at once."""
        optimizer = sys.modules.get("torch.optim.optimizer")
        handle = self.step_handle
        if optimizer is None or handle is None:
            return
        if not set(optimizer._global_optimizer_post_hooks) - {handle.id}:
            handle.remove()
            self.step_handle = None

    def wake(self) -> None:
        """A new agent attached: the hooks time steps again (the first one partly seen)."""
        for cls, name, _, ours in self.patches:
            setattr(cls, name, ours)
        try:
            _serve.wake(self.serve)
        except Exception:  # the step timing works without the forwards
            self.serve.quiet = False
        if self.step_handle is None and self.torch is not None:
            from torch.optim import optimizer

            self.step_handle = optimizer.register_optimizer_step_post_hook(self.after_step)
        self.channel.gone_since = None
        self.partial = True
        self.quiet = False
        if self.compute is not None:  # the new look's first sampled steps are counted
            try:
                self.compute.restart()
            except Exception:  # never break the job
                pass

    def after_fork(self) -> None:
        """In a forked child: a lock held by another thread of the parent at the fork is
        made anew, and what the parent had buffered is left to the parent (sent twice, the
        rows would count twice); the child's own steps and requests are sent from now on."""
        self._flushing = threading.Lock()
        self.pending = array("d")
        self.sites = {}
        self.last_flush = time.perf_counter()
        self.serve.after_fork()

    def after_step(self, opt: Any, args: object, kwargs: object) -> None:
        """Our one global optimizer post hook: the step's timing, then `step_calls`."""
        self.on_step()
        if self.compute is not None and not self.quiet:
            try:
                self.compute.note_optimizer(opt)
                self.compute.on_step()
            except Exception:  # never break the job: no more sampled steps
                if getattr(self.compute, "debug", False):
                    raise
                self.compute = None
        for call in self.step_calls:
            call()

    def on_step(self) -> None:
        if self.quiet:
            return
        now = time.perf_counter()
        prev = self.last_step if self.last_step is not None else self.loop_start
        if self.partial:
            prev, self.partial = None, False  # the step they came in during: the loop's start
        self.last_step = now
        self.pending.extend(
            (
                time.time(),
                now - prev if prev is not None else math.nan,
                self.data_wait,
                self.batch,
                self.h2d,
                self.pinned,
                self.pageable,
                self.syncs,
                self.sync_time,
            )
        )
        self.data_wait = self.h2d = self.sync_time = 0.0
        self.batch = self.pinned = self.pageable = self.syncs = 0
        if now - self.last_flush >= FLUSH_S or len(self.pending) >= MAX_ROWS * STEP_WIDTH:
            self.flush(now)

    def maybe_flush(self) -> None:
        """Flush when FLUSH_S passed since the last (a forward or request just ended); quiet,
        drop what was buffered instead."""
        now = time.perf_counter()
        if now - self.last_flush >= FLUSH_S:
            if self.quiet:
                self.last_flush = now
                self.serve.take()
                self.serve.take_extra()
                self.serve.padding.clear()
            else:
                self.flush(now)

    def exit_flush(self, wait_s: float = EXIT_WAIT_S) -> None:
        """The last flush, at exit: while the agent's queue is full, offer what it refused
        again every 20 ms for at most `wait_s` (never when no agent listens)."""
        self.flush()
        end = time.monotonic() + wait_s
        while self._refused() and not self.quiet and time.monotonic() < end:
            time.sleep(0.02)
            self.flush()

    def _refused(self) -> bool:
        """Whether the last send found the agent's queue full with rows still kept."""
        kept = self.pending or self.serve.forwards or self.serve.requests
        return self.channel.full and bool(kept)

    def flush(self, now: float | None = None) -> None:
        if not self._flushing.acquire(blocking=False):
            return  # another thread is sending: its flush carries these rows or the next does
        try:
            self._flush(now)
        finally:
            self._flushing.release()

    def _flush(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        self.last_flush = now
        msg: dict = {"v": 2, "pid": os.getpid(), "width": STEP_WIDTH}
        if self.sites:
            msg["sites"] = self.sites
        if self.cuda and now - self.last_mem >= MEM_EVERY_S:
            self.last_mem = now
            msg["mem"] = _cuda_memory(self.torch)
        if self.torch is not None and now - self.last_switches >= MEM_EVERY_S:
            self.last_switches = now
            switches = _switches(self.torch)
            if switches:
                msg["switches"] = switches
        recs = self.compute.take() if self.compute is not None else []
        if recs:
            msg["cmp"] = recs
        if self.pending or len(msg) > 3:
            # sent or not, the rows are gone (with no agent listening they are dropped),
            # unless the agent's queue was full: then they go with the next flush
            sent = self.channel.send(msg, self.pending)
            if sent or not self._keep_steps():
                self.pending = array("d")
                self.sites = {}
            if not sent and recs and self.channel.full and self.compute is not None:
                self.compute.put_back(recs)  # a look's first counted steps: kept, not lost
        self._flush_serving()
        if self.attached and self.channel.gone_for() > QUIET_AFTER_S:
            self.go_quiet()

    def _keep_steps(self) -> bool:
        """Whether the step rows a send could not hand over are kept for the next flush:
        the agent's queue was full, and they are fewer than MAX_ROWS."""
        return self.channel.full and len(self.pending) < MAX_ROWS * STEP_WIDTH

    def _flush_serving(self) -> None:
        """The forwards and requests since the last flush, SERVE_ROWS a datagram; those the
        agent's full queue refused go back to the recorder, sent with the next flush."""
        fwd, req = self.serve.take()
        while fwd or req:
            msg: dict = {"v": 2, "pid": os.getpid(), "width": STEP_WIDTH}
            if fwd:
                msg["fwd"], fwd = fwd[:SERVE_ROWS], fwd[SERVE_ROWS:]
            if req:
                msg["req"], req = req[:SERVE_ROWS], req[SERVE_ROWS:]
            if not self.channel.send(msg) and self.channel.full:
                self.serve.put_back(msg.get("fwd", []) + fwd, msg.get("req", []) + req)
                return
        extra = self.serve.take_extra()  # padding and new models: datagrams of their own
        while any(extra.values()):
            msg = {"v": 2, "pid": os.getpid(), "width": STEP_WIDTH}
            for key, rows in extra.items():
                if rows:
                    msg[key], extra[key] = rows[:SERVE_ROWS], rows[SERVE_ROWS:]
            self.channel.send(msg)


_state: _State | None = None


def current() -> _State | None:
    """The hooks' state in this process (None before they are installed): what `attach
    --hooks` reuses and wakes."""
    return _state


def _cuda_memory(torch: Any) -> dict:
    try:
        stats = torch.cuda.memory_stats()
        return {
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "peak": torch.cuda.max_memory_allocated(),
            "alloc_retries": stats.get("num_alloc_retries", 0),
            "inactive_split": stats.get("inactive_split_bytes.all.current", 0),
        }
    except Exception:
        return {}


# torch's global settings a job can leave in a slow state, read at start and every
# MEM_EVERY_S: (the name sent, how it is read). One table; what each costs and how to change
# it is analyzers/measures/switches.py's SETTINGS (docs/findings.md#debug001).
SETTINGS = (
    ("anomaly", lambda torch: torch.is_anomaly_enabled()),
    ("anomaly_check_nan", lambda torch: torch.is_anomaly_check_nan_enabled()),
    ("deterministic", lambda torch: torch.are_deterministic_algorithms_enabled()),
    ("matmul_highest", lambda torch: torch.get_float32_matmul_precision() == "highest"),
    ("cudnn_benchmark", lambda torch: torch.backends.cudnn.benchmark),
    ("cudnn_deterministic", lambda torch: torch.backends.cudnn.deterministic),
)


def _switches(torch: Any) -> dict:
    """torch's global settings (SETTINGS) as 1 or 0, each read on its own (an older torch
    without one leaves it out); anomaly detection's NaN check only while it is on."""
    out = {}
    for name, read in SETTINGS:
        try:
            out[name] = int(bool(read(torch)))
        except Exception:
            continue
    if not out.get("anomaly"):
        out.pop("anomaly_check_nan", None)
    return out


def _batch_size(batch: Any) -> int:
    for _ in range(3):
        if isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        elif isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        else:
            break
    try:  # a nested tensor's .shape raises; a custom batch's may be anything
        shape = getattr(batch, "shape", None)
        return int(shape[0]) if shape else 0
    except Exception:
        return 0


def _install(torch: Any) -> None:
    """Patch DataLoader iteration and register the optimizer hook (and CUDA hooks)."""
    st = _state
    if st is None or st.torch is not None:
        return
    st.torch = torch
    from torch.utils.data import dataloader

    orig_next = dataloader._BaseDataLoaderIter.__next__

    def __next__(self):
        __tracebackhide__ = True  # noqa: F841 (pytest and IPython hide this frame)
        t0 = time.perf_counter()
        if st.loop_start is None:
            st.loop_start = t0  # the first step's time counts from the first fetch
        batch = orig_next(self)
        st.data_wait += time.perf_counter() - t0
        st.batch += _batch_size(batch)
        return batch

    dataloader._BaseDataLoaderIter.__next__ = __next__
    st.patches.append((dataloader._BaseDataLoaderIter, "__next__", orig_next, __next__))
    _install_trim()
    from torch.optim import optimizer

    st.step_handle = optimizer.register_optimizer_step_post_hook(st.after_step)
    try:
        _serve.install_forwards(torch, st.serve)
    except Exception as exc:  # the step timing works without it
        print(f"gpudiag: forward hooks not installed: {exc}", file=sys.stderr)
    _guarded("compute sampler", lambda: _install_compute(torch, st))
    if not st.attached or _dist_initialized(torch):  # attach: a job's ranks run already
        _install_dist(torch, st)
    _guarded("try's fix", lambda: _sibling("gpudiag_fixes").install(torch))  # under `try` only
    _guarded("profiler capture", lambda: _install_capture(torch, st))
    if torch.cuda.is_available() and _guarded("CUDA hooks", lambda: _install_cuda(torch, st)):
        st.cuda = True
    _guarded("settings", st.flush)  # torch's settings at start: the agent hears the hooks
    atexit.register(st.exit_flush)


def _install_compute(torch: Any, st: _State) -> None:
    """The sampled steps' split of compute by module (gpudiag_compute, beside this file)."""
    if os.environ.get(_channel.CAPTURE_ENV):
        return  # a profiler capture from the start: its steps are the profiler's alone
    compute = _sibling("gpudiag_compute")
    st.compute = compute.Sampler(torch, st.serve.models, cuda=torch.cuda.is_available())


def _guarded(what: str, install: Callable[[], object]) -> bool:
    """`install()` run so that it never breaks the job: an exception is one line on stderr
    (the step timing works without it); whether it ran to its end."""
    try:
        install()
        return True
    except Exception as exc:
        print(f"gpudiag: {what} not installed: {exc}", file=sys.stderr)
        return False


def _sibling(name: str) -> Any:
    """A module beside this file, whether loaded as a package or by sitecustomize."""
    import importlib

    return importlib.import_module(f"{__package__}.{name}" if __package__ else name)


def _install_trim() -> None:
    """gpudiag's frames out of the job's printed tracebacks (gpudiag_trim, beside this file)."""
    try:
        try:
            from . import gpudiag_trim
        except ImportError:
            import gpudiag_trim
        gpudiag_trim.install()
    except Exception:  # never break the job
        pass


def _dist_initialized(torch: Any) -> bool:
    """Whether the job runs torch.distributed's process group (a rank of a multi-rank job)."""
    try:
        return bool(torch.distributed.is_available() and torch.distributed.is_initialized())
    except Exception:
        return False


def _install_dist(torch: Any, st: _State) -> None:
    """Collective counters per rank (gpudiag_dist, beside this file)."""
    try:
        try:
            from . import gpudiag_dist
        except ImportError:
            import gpudiag_dist
        gpudiag_dist.install(torch, st.channel.path)
    except Exception as exc:  # never break the job
        print(f"gpudiag: collective hooks not installed: {exc}", file=sys.stderr)


def _install_capture(torch: Any, st: _State) -> None:
    """The bounded profiler capture (gpudiag_capture.py): at start with `--capture-steps N`,
    or when the agent asks for one later."""
    try:
        from . import gpudiag_capture
    except ImportError:  # loaded as a top-level module by sitecustomize
        import gpudiag_capture
    watcher = gpudiag_capture.Watcher(torch, st.channel.path or attach_path(os.getpid()))
    if st.compute is not None:  # the compute sampler's hooks stay out of a profiled step
        st.compute.paused = watcher.capturing

    def on_step() -> None:
        if not st.quiet:
            watcher.on_step()

    if st.attached:  # in our one step hook, which quiet hooks take out
        st.step_calls.append(on_step)
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda opt, args, kwargs: on_step())


def _install_cuda(torch: Any, st: _State) -> None:
    tensor = torch.Tensor
    orig_to, orig_cuda = tensor.to, tensor.cuda

    def timed_copy(orig):
        def wrapper(self, *args, **kwargs):
            if self.device.type != "cpu":
                return orig(self, *args, **kwargs)
            t0 = time.perf_counter()
            out = orig(self, *args, **kwargs)
            if out.device.type == "cuda":
                st.h2d += time.perf_counter() - t0
                if self.is_pinned():
                    st.pinned += 1
                else:
                    st.pageable += 1
            return out

        return wrapper

    tensor.to, tensor.cuda = timed_copy(orig_to), timed_copy(orig_cuda)

    def counted(orig, name):
        def wrapper(*args, **kwargs):
            first: Any = args[0] if args else None
            if (
                name != "synchronize"
                and getattr(first, "device", None) is not None
                and first.device.type != "cuda"
            ):
                return orig(*args, **kwargs)
            t0 = time.perf_counter()
            out = orig(*args, **kwargs)
            st.sync_time += time.perf_counter() - t0
            st.syncs += 1
            if st.syncs % SITE_EVERY == 1:
                f = sys._getframe(1)
                site = f"{f.f_code.co_filename}:{f.f_lineno}:{f.f_code.co_name}:{name}"
                st.sites[site] = st.sites.get(site, 0) + 1
            return out

        return wrapper

    for name in ("item", "cpu", "tolist"):
        setattr(tensor, name, counted(getattr(tensor, name), name))
    torch.cuda.synchronize = counted(torch.cuda.synchronize, "synchronize")


class _TorchWatcher:
    """A meta path finder that installs the hooks right after `import torch` finishes. It
    stays until torch is imported: a `importlib.util.find_spec("torch")` that only asks
    whether torch is there (transformers' is_torch_available, before its `import torch`)
    must not use it up (a FastAPI app importing transformers first got no forward hooks)."""

    def __init__(self) -> None:
        self._asking = threading.local()  # our own find_spec below: not watched again

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or getattr(self._asking, "on", False):
            return None
        import importlib.util

        self._asking.on = True
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self._asking.on = False
        if spec is not None and spec.loader is not None:
            orig = spec.loader.exec_module

            def exec_module(module):
                orig(module)
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                try:
                    _install(module)
                except Exception as exc:
                    print(f"gpudiag: in-process hooks not installed: {exc}", file=sys.stderr)

            spec.loader.exec_module = exec_module
        return spec

    def find_module(self, name, path=None):  # pragma: no cover - legacy protocol
        return None


def install_on_torch_import(channel: str | None = None, attached: bool = False) -> None:
    """Hook the job when it imports torch (now, if it already has); `attached`: loaded into
    a running job by `gpudiag attach --hooks`."""
    global _state
    if _state is not None:
        return
    _state = _State(_Channel(channel or os.environ.get(CHANNEL_ENV)), attached)
    try:
        _serve.install_requests(_state.serve)
    except Exception as exc:  # never break the job
        print(f"gpudiag: request hooks not installed: {exc}", file=sys.stderr)
    if "torch" in sys.modules:
        _guarded("in-process hooks", lambda: _install(sys.modules["torch"]))
    else:
        sys.meta_path.insert(0, _TorchWatcher())


def _after_fork_in_child() -> None:
    """os.register_at_fork's hook in each forked child (gunicorn's workers forked by its
    master): the hooks' state made safe to use there (`_State.after_fork`)."""
    st = _state
    if st is None:
        return
    try:
        st.after_fork()
    except Exception:  # never break the child
        pass


_guarded("fork hooks", lambda: os.register_at_fork(after_in_child=_after_fork_in_child))


def instrument() -> None:
    """Connect this job to a later `gpudiag attach PID`: the same hooks as `gpudiag run`.

    Call it at the top of the training script. Until an agent attaches, events are dropped
    at the cost of a failed non-blocking send every 0.1 s.
    """
    _guarded("in-process hooks", lambda: install_on_torch_import(os.environ.get(CHANNEL_ENV)))
