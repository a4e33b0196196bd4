"""The agent's end of the in-process hooks: a private socket the job's hooks write to.

`gpudiag run` creates the socket before launching the job and passes its path in
GPUDIAG_CHANNEL with the hooks' folder first on PYTHONPATH; `gpudiag attach PID` creates it
at the path an `instrument()`-ed job looks for. The folder is private (0700, owned by this
user: one made by another user, or a link, is refused), the socket 0600, and each datagram's
sender is checked by the kernel's credentials (SCM_CREDENTIALS): only this user's are read.
What arrives is data (a JSON header and packed doubles), never code; reads are
non-blocking and bounded per tick.
"""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import struct
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from gpudiag.probes.base import Field, Probe, ProbeStatus, Sample, Target, now_ns
from gpudiag.probes.dist.collectives import FIELDS as COLLECTIVE_FIELDS
from gpudiag.probes.dist.collectives import RankLabels
from gpudiag.probes.inject import gpudiag_hooks
from gpudiag.probes.inject.gpudiag_channel import (
    CHANNEL_ENV,
    FIX_ENV,
    STEP_FIELDS,
    STEP_WIDTH,
    STEPS_ENV,
    folder_problem,
    write_request,
)
from gpudiag.probes.inprocess.calibrate import Calibrator
from gpudiag.probes.inprocess.compute_rows import FIELDS as COMPUTE_FIELDS
from gpudiag.probes.inprocess.compute_rows import compute_samples
from gpudiag.probes.net import unix_bound
from gpudiag.probes.numbers import finite_number

INJECT_DIR = str(Path(gpudiag_hooks.__file__).resolve().parent)
MAX_DATAGRAMS_PER_TICK = 2000
CALIB_CLOSE_WAIT_S = 15.0  # a calibration child in flight at the end: waited for this long
WORK_KINDS = ("step", "forward", "request")  # the hooks' samples of the work a job repeats
# A unit of the model's work (a step, a forward) weighs more than a request: where one process
# takes the requests and another runs the model (Ray Serve's proxy and its replica), the
# stacks follow the model's.
WORK_WEIGHT = {"step": 2, "forward": 2, "request": 1}
FOLLOW_MIN = 20  # units of work before a child is followed (a helper's early health checks)
REFOLLOW_FACTOR = 2  # another child followed instead once it sent this many times more
LOADED = "loaded into the running job"
MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path less its NUL)
_SHORTER = (
    f"a socket's path holds at most {MAX_SOCKET_PATH} bytes: set TMPDIR (run) or "
    "XDG_RUNTIME_DIR (attach) to a shorter folder"
)  # how a hooks status that `attach --hooks` set begins


def injection_env(env: dict[str, str], channel: str) -> dict[str, str]:
    """The launched job's environment: our sitecustomize first on PYTHONPATH, the channel;
    `try`'s variables dropped (a stale one changed an ordinary run: `try` sets its own)."""
    out = {k: v for k, v in env.items() if k not in (FIX_ENV, STEPS_ENV)}
    prev = out.get("PYTHONPATH")
    out["PYTHONPATH"] = INJECT_DIR + (os.pathsep + prev if prev else "")
    out[CHANNEL_ENV] = channel
    return out


class HookProbe(Probe):
    """Receives step events from the job's hooks and turns them into samples."""

    name = "hooks"
    interval_s = 0.5
    buffered = True  # a calibration that ends while close() waits: the session's last drain
    captures = True
    fields = (
        Field("step_time_s", "s", "gauge", "wall time of one optimizer step to the next"),
        Field("data_wait_s", "s", "gauge", "time in DataLoader iteration during the step"),
        Field("batch_size", "samples", "gauge", "samples in the step's batches"),
        Field("h2d_copy_s", "s", "gauge", "host time in host-to-device copies (CUDA)"),
        Field("h2d_pinned", "count", "gauge", "copies from pinned memory in the step"),
        Field("h2d_pageable", "count", "gauge", "copies from pageable memory in the step"),
        Field("syncs", "count", "gauge", "host-device syncs in the step (CUDA)"),
        Field("sync_time_s", "s", "gauge", "host time blocked in those syncs"),
        Field("count", "count", "counter", "syncs seen at one call site (sampled 1 in 16)"),
        Field("allocated", "bytes", "gauge", "torch.cuda memory allocated"),
        Field("reserved", "bytes", "gauge", "torch.cuda memory reserved by the cache"),
        Field("peak", "bytes", "gauge", "torch.cuda peak memory allocated"),
        Field("alloc_retries", "count", "counter", "allocator retries after freeing cache"),
        Field("inactive_split", "bytes", "gauge", "fragmented (inactive split) bytes"),
        Field("first_step", "ratio", "gauge", "1 on the job's first optimizer step"),
        Field("anomaly_mode", "ratio", "gauge", "1 while autograd anomaly detection is on"),
        Field(
            "anomaly_check_nan",
            "ratio",
            "gauge",
            "1 while anomaly detection checks every gradient for NaN",
        ),
        Field(
            "deterministic_algorithms",
            "ratio",
            "gauge",
            "1 while torch.use_deterministic_algorithms(True) is on",
        ),
        Field(
            "matmul_precision_highest",
            "ratio",
            "gauge",
            "1 while torch.get_float32_matmul_precision() is 'highest' (no TF32)",
        ),
        Field("cudnn_benchmark", "ratio", "gauge", "1 while torch.backends.cudnn.benchmark"),
        Field(
            "cudnn_deterministic", "ratio", "gauge", "1 while torch.backends.cudnn.deterministic"
        ),
        Field("forward_time_s", "s", "gauge", "wall time of one outermost model forward"),
        Field("forward_batch", "items", "gauge", "first dimension of the forward's input"),
        Field("forward_grad", "ratio", "gauge", "1 when autograd was on in the forward"),
        Field("pad_rows", "items", "gauge", "rows of a forward's attention mask"),
        Field("pad_tokens", "tokens", "gauge", "tokens the forward computed: rows x length"),
        Field("pad_real_tokens", "tokens", "gauge", "of those, the mask's real (1) tokens"),
        Field("pad_longest_tokens", "tokens", "gauge", "rows x the batch's longest row"),
        Field("pad_sq_tokens", "tokens^2", "gauge", "rows x the padded length squared"),
        Field("pad_longest_sq_tokens", "tokens^2", "gauge", "rows x the longest row squared"),
        Field("pads_rows", "items", "gauge", "the last rows whose lengths were kept"),
        Field("pads_tokens", "tokens", "gauge", "their tokens, sorted by length and batched"),
        Field("pads_sq_tokens", "tokens^2", "gauge", "the same, each row's length squared"),
        Field("pads_batch", "items", "gauge", "the batch they were cut into (the median)"),
        Field(
            "model_new", "count", "gauge", "1: the first forward of a top module not seen before"
        ),
        Field("model_known", "count", "gauge", "1: where that module was loaded from is known"),
        Field("model_repeat", "count", "gauge", "1: a module was loaded from there before"),
        Field("request_latency_s", "s", "gauge", "an HTTP request, parsed to answered"),
        Field("request_in_flight", "count", "gauge", "requests in flight as it started"),
        *COLLECTIVE_FIELDS,
        *COMPUTE_FIELDS,
        Field(
            "capture_steps",
            "count",
            "gauge",
            "steps in a profiler capture (its summary is the sample's `summary` label)",
        ),
    )

    def __init__(self, path: str | None = None, optional: bool = False) -> None:
        self._dir: str | None = None
        self.path = path
        self.optional = optional  # attach: the job connects only if it called instrument()
        self._sock: socket.socket | None = None
        self.messages = 0
        self.rejected = 0  # datagrams from another user, dropped
        self.malformed = 0  # datagrams that could not be read, dropped one by one
        self.labels = RankLabels()  # distributed jobs: the rank each datagram comes from
        self.refused: ProbeStatus | None = None  # the channel's folder was not private
        self.loop_pid: int | None = None  # the process whose steps count (one-process jobs)
        self.profiled: int | None = None  # the profiled process: its steps win once it sends
        self.other_steps = 0  # step rows of another process (a forked child), dropped
        self.work: dict[int, int] = {}  # sender pid -> its steps, forwards and requests
        self.nonce: str | None = None  # attach --hooks: the handshake the loaded hooks answer
        self.hellos: dict[int, dict] = {}  # pid -> its hooks' hello (attach --hooks)
        self.loaded: ProbeStatus | None = None  # how `attach --hooks` went, for the report
        self._held: list[Sample] = []  # samples read while waiting for the hellos
        self.blocked: str | None = None  # run: why the profiled process cannot load them
        self.calibrator = Calibrator()  # the CPU's rate at the job's sizes (compute_rows)

    def open(self, target: Target) -> ProbeStatus:
        """Bind the private socket (at `path`, or in a new private folder)."""
        try:
            if self.path is None:
                self._dir = tempfile.mkdtemp(prefix="gpudiag-")  # mode 0700
                self.path = os.path.join(self._dir, "hooks.sock")
            else:
                folder = os.path.dirname(self.path)
                os.makedirs(folder, mode=0o700, exist_ok=True)
                st = os.lstat(folder)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                    os.chmod(folder, 0o700)  # ours, made by an older gpudiag: close it
                problem = folder_problem(folder)
                if problem is not None:  # the same check the job's hooks make
                    path, self.path = self.path, None
                    self.refused = ProbeStatus(
                        self.name,
                        False,
                        f"refused, not this user's own folder: {problem}; the job's step, "
                        "collective and capture "
                        "channels are not put there (another user could read them)",
                        f"remove {folder}, or set XDG_RUNTIME_DIR to a private folder "
                        f"({os.path.basename(path)} goes in gpudiag-<uid> under it)",
                    )
                    return self.refused
                if unix_bound(self.path):  # another agent's: its steps are left to it
                    path, self.path = self.path, None
                    self.refused = ProbeStatus(
                        self.name,
                        False,
                        f"another gpudiag is receiving this job's steps at {path} (an "
                        "attach or watch of the same job): they are left to it",
                        "let the other gpudiag finish, or stop it, then attach again",
                    )
                    return self.refused
                if os.path.lexists(self.path):
                    os.unlink(self.path)  # a socket left by an agent that died
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.bind(self.path)
            os.chmod(self.path, 0o600)
            if hasattr(socket, "SO_PASSCRED"):  # the kernel tells who sent each datagram
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self._sock.setblocking(False)
        except OSError as exc:
            where = self.path
            self.close()  # nothing left behind: the socket, the folder made for it
            self.path = None
            self.refused = ProbeStatus(
                self.name,
                False,
                f"cannot create the hooks' socket {where}: {exc.strerror or exc}; the job "
                "runs without its step timing",
                _SHORTER if where and len(os.fsencode(where)) > MAX_SOCKET_PATH else None,
            )
            return self.refused
        return ProbeStatus(self.name, True)

    def sample(self) -> list[Sample]:
        """Drain what the hooks sent since the last tick."""
        out, self._held = self._held, []
        sock = self._sock  # close() may run meanwhile (the job ended): a closed socket raises
        if sock is None:
            return out + self.calibrator.take()  # a child that ended after the last datagram
        for _ in range(MAX_DATAGRAMS_PER_TICK):
            try:
                data, anc, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(12))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not self._from_us(anc):
                self.rejected += 1
                continue
            sender = self._sender_pid(anc)
            try:  # one bad datagram is dropped, never the probe
                msg = decode_datagram(data)
                if msg is None:
                    continue
                got = self.labels.tag(msg, parse_message(msg))
                got += self.calibrator.on_samples(got)
            except Exception:  # noqa: BLE001 (data from the job: whatever it raises)
                self.malformed += 1
                continue
            self.messages += 1
            self._note_hello(msg, sender)
            self._count_work(sender if sender is not None else msg.get("pid"), got)
            out += got if self.labels.enabled else self._one_process(sender, msg, got)
        return out

    def _count_work(self, pid: Any, got: list[Sample]) -> None:
        """Count the units of work (steps, forwards, requests) each process sent."""
        n = sum(WORK_WEIGHT.get(s.labels.get("kind", ""), 0) for s in got)
        if n and isinstance(pid, int) and (pid in self.work or len(self.work) < 4096):
            self.work[pid] = self.work.get(pid, 0) + n

    def worker(self, target: int, followed: int | None = None) -> int | None:
        """The process doing the job's work when it is not `target` itself: the one that sent
        the most units of work (weighted: `WORK_WEIGHT`), at least FOLLOW_MIN of them; None
        while `target` sent any or none did. With a child `followed` already, another only
        once it sent REFOLLOW_FACTOR times more (Ray's dashboard agent answered health checks
        before the load reached the replica)."""
        if not self.work or target in self.work:
            return None
        best = max(self.work, key=lambda pid: self.work[pid])
        if self.work[best] < FOLLOW_MIN or best == followed:
            return None
        if followed is not None and self.work[best] < REFOLLOW_FACTOR * self.work.get(followed, 0):
            return None
        return best

    def _note_hello(self, msg: dict, sender: int | None) -> None:
        """Keep the hello of hooks `attach --hooks` loaded (the nonce it was given)."""
        hello = msg.get("hello")
        if not isinstance(hello, dict) or self.nonce is None or hello.get("nonce") != self.nonce:
            return
        pid = sender if sender is not None else msg.get("pid")
        if isinstance(pid, int):
            self.hellos[pid] = {
                k: v if isinstance(v, bool) else v[:300]
                for k, v in hello.items()
                if isinstance(v, (bool, str))
            }

    def await_hello(self, pids: list[int], timeout_s: float) -> dict[int, dict]:
        """The hellos of `pids`' hooks, waited for at most `timeout_s`; what arrives
        meanwhile is kept for the next sample()."""
        end = time.monotonic() + timeout_s
        while not all(p in self.hellos for p in pids) and time.monotonic() < end:
            self._held = self.sample()
            time.sleep(0.05)
        return {p: self.hellos[p] for p in pids if p in self.hellos}

    def _one_process(self, sender: int | None, msg: dict, got: list[Sample]) -> list[Sample]:
        """Without ranks, the steps of one process: the profiled one's once it sends any,
        else the first that sent steps (a launcher's child doing the work). A forked child's
        hooks send on the same channel; merged, its steps were added to the parent's (50.8
        steps/s reported for 19.1), and kept as the first sender, they replaced the parent's
        (87 steps/s reported for 19.1)."""
        pid = sender if sender is not None else msg.get("pid")
        if not isinstance(pid, int) or not any(s.labels.get("kind") == "step" for s in got):
            return got
        if self.loop_pid is None or (pid == self.profiled and self.loop_pid != pid):
            self.loop_pid = pid
        if pid == self.loop_pid:
            return got
        kept = [s for s in got if s.labels.get("kind") != "step"]
        self.other_steps += len(got) - len(kept)
        return kept

    @staticmethod
    def _sender_pid(ancillary: list) -> int | None:
        """The sender's pid as the kernel gives it (SCM_CREDENTIALS), else None."""
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", -1):
                if len(data) >= 12:
                    return struct.unpack("iII", data[:12])[0]
        return None

    @staticmethod
    def _from_us(ancillary: list) -> bool:
        """Whether the sender's uid (SCM_CREDENTIALS) is ours; True where the OS has none."""
        if not hasattr(socket, "SCM_CREDENTIALS"):
            return True
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 12:
                _pid, uid, _gid = struct.unpack("iII", data[:12])
                return uid == os.geteuid()
        return False

    def request_capture(self, steps: int) -> bool:
        """Ask the job's hooks for a profiler capture of `steps` steps (they look for the
        request every 0.5 s); False when there is no socket to put it beside."""
        if not self.path or not 1 <= steps <= 1000:
            return False
        return write_request(self.path + ".capture", str(int(steps)))

    def final_status(self) -> ProbeStatus:
        """Available, and whether the job's hooks ever reported."""
        if self.refused is not None:
            return self.refused
        if self._sock is None and self.path is None:
            return ProbeStatus(self.name, False, "not started")
        if self.loaded is not None:
            return self.loaded
        if self.messages:
            return ProbeStatus(self.name, True)
        if self.optional:
            return ProbeStatus(
                self.name,
                True,
                "not connected (optional): the job's own step "
                "timing would add exact steps/s, step-time percentiles, the "
                "data wait per step and profiler captures",
                "attach with `--hooks` to load them into the running job (on Python 3.10-3.13 "
                "by pyinjector where it is installed, else gdb; sys.remote_exec on 3.14+), add "
                "`from gpudiag.probes.hooks import "
                "instrument; instrument()` at the top of the training script, or "
                "start it with `gpudiag run -- CMD`",
                info=True,
            )
        if self.blocked:
            return ProbeStatus(
                self.name,
                True,
                f"no events from the job's hooks: {self.blocked}, so the sitecustomize "
                "that loads them is never imported",
                "attach with `--hooks` to load them into the running process (gpudiag attach "
                "--hooks PID), or call gpudiag.probes.hooks.instrument() in the code it runs "
                "(a Triton model's model.py, its Python given gpudiag)",
            )
        return ProbeStatus(
            self.name,
            True,
            "no step events from the job: it did not import "
            "torch, has no optimizer steps yet, or was not hooked",
            "with `gpudiag run` keep the default injection; for jobs started "
            "another way call gpudiag.probes.hooks.instrument() in the script",
        )

    def cpu_s(self) -> float:
        """CPU seconds of the agent's calibration children (the CPU's rate at the job's sizes)."""
        return self.calibrator.cpu_s()

    def child_rss_bytes(self) -> int:
        """The peak memory of a calibration child since the governor's last period (0: none)."""
        return self.calibrator.take_peak_rss()

    def close(self) -> None:
        """Remove the socket (a job still sending then just drops its events); a calibration
        child still running is waited for (CALIB_CLOSE_WAIT_S at most): its samples are
        the last drain's."""
        self.calibrator.join(CALIB_CLOSE_WAIT_S)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for path in (self.path and self.path + ".capture", self.path, self._dir):
            if path and os.path.exists(path):
                try:
                    (os.rmdir if os.path.isdir(path) else os.unlink)(path)
                except OSError:
                    pass


def decode_datagram(data: bytes) -> dict | None:
    """A hooks datagram: JSON header line, then the step rows as packed doubles."""
    head, sep, body = data.partition(b"\n")
    try:
        msg = json.loads(head)
    except (ValueError, RecursionError):  # not JSON, NaN spelled oddly, nested too deep
        return None
    if not isinstance(msg, dict):
        return None
    width = msg.get("width", 9) or 9
    if type(width) is not int or not 1 <= width <= 64:
        return None  # not our hooks' datagram: dropped
    if sep and body and len(body) % (8 * width) == 0:
        flat = array("d")
        flat.frombytes(body)
        msg["steps"] = [
            [None if math.isnan(v) else v for v in flat[i : i + width]]
            for i in range(0, len(flat), width)
        ]
    return msg


def parse_message(msg: dict) -> list[Sample]:
    """Samples from one datagram of the hooks (steps, sync call sites, CUDA memory)."""
    out: list[Sample] = []
    if not isinstance(msg, dict):
        return out
    steps = msg.get("steps", [])
    for row in steps if isinstance(steps, list) else []:
        if not isinstance(row, list) or len(row) != STEP_WIDTH:
            continue
        if not _numbers(row[:1]) or abs(row[0]) > 1e10:
            continue  # data only: a malformed row is dropped, never evaluated
        t_ns = int(float(row[0]) * 1e9)
        if row[1] is None:
            out.append(Sample("hooks", t_ns, {"kind": "step"}, {"first_step": 1.0}))
            continue
        if not _numbers(row[1:]):
            continue
        out.append(
            Sample(
                "hooks",
                t_ns,
                {"kind": "step"},
                {k: float(v) for k, v in zip(STEP_FIELDS, row[1:], strict=True)},
            )
        )
    out += serving_samples(msg)
    out += compute_samples(msg)
    t = out[-1].t_ns if out else now_ns()
    sites = msg.get("sites")
    for site, n in sites.items() if isinstance(sites, dict) else ():
        if _numbers([n]):
            out.append(
                Sample("hooks", t, {"kind": "sync_site", "site": str(site)}, {"count": float(n)})
            )
    cap = msg.get("capture")
    if isinstance(cap, dict) and isinstance(cap.get("steps"), list):
        try:
            t_cap = int(float(cap.get("t0") or t / 1e9) * 1e9)
        except (TypeError, ValueError, OverflowError):
            t_cap = t  # data only: a malformed time is replaced, never trusted
        out.append(
            Sample(
                "hooks",
                t_cap,
                {"kind": "capture", "summary": json.dumps(cap, separators=(",", ":"))},
                {"capture_steps": float(len(cap["steps"]))},
            )
        )
    mem = msg.get("mem")
    if isinstance(mem, dict) and mem:
        out.append(
            Sample(
                "hooks",
                t,
                {"kind": "cuda_mem"},
                {
                    k: float(v)
                    for k, v in mem.items()
                    if k in ("allocated", "reserved", "peak", "alloc_retries", "inactive_split")
                    and _numbers([v])
                },
            )
        )
    out += switch_samples(msg, t)
    return out


SWITCHES = {
    "anomaly": "anomaly_mode",
    "anomaly_check_nan": "anomaly_check_nan",
    "deterministic": "deterministic_algorithms",
    "matmul_highest": "matmul_precision_highest",
    "cudnn_benchmark": "cudnn_benchmark",
    "cudnn_deterministic": "cudnn_deterministic",
}


def switch_samples(msg: dict, t: int) -> list[Sample]:
    """torch's global settings the hooks read (1 on, 0 off), one sample."""
    sw = msg.get("switches")
    if not isinstance(sw, dict):
        return []
    values: dict[str, float | None] = {
        SWITCHES[k]: float(v) for k, v in sw.items() if k in SWITCHES and _numbers([v])
    }
    return [Sample("hooks", t, {"kind": "switches"}, values)] if values else []


SERVING_ROWS = {
    "fwd": ("forward", ("forward_time_s", "forward_batch", "forward_grad")),
    "req": ("request", ("request_latency_s", "request_in_flight")),
    "pad": (
        "padding",
        (
            "pad_rows",
            "pad_tokens",
            "pad_real_tokens",
            "pad_longest_tokens",
            "pad_sq_tokens",
            "pad_longest_sq_tokens",
        ),
    ),
    "pads": ("padding_sorted", ("pads_rows", "pads_tokens", "pads_sq_tokens", "pads_batch")),
    "mdl": ("model", ("model_new", "model_known", "model_repeat")),
}


def _padding_ok(v: dict[str, float | None]) -> bool:
    """Whether a padding row adds up: real <= longest <= all tokens, none negative."""
    real, longest = v["pad_real_tokens"] or 0.0, v["pad_longest_tokens"] or 0.0
    sq, longest_sq = v["pad_sq_tokens"] or 0.0, v["pad_longest_sq_tokens"] or 0.0
    return (
        0 <= real <= longest <= (v["pad_tokens"] or 0.0)
        and 0 <= longest_sq <= sq
        and (v["pad_rows"] or 0.0) >= 1
    )


def serving_samples(msg: dict) -> list[Sample]:
    """Samples of the forwards and requests of one datagram (rows [end time, values...]);
    a malformed row is dropped."""
    out: list[Sample] = []
    for key, (kind, names) in SERVING_ROWS.items():
        rows = msg.get(key)
        for row in rows if isinstance(rows, list) else ():
            if not isinstance(row, list) or len(row) != len(names) + 1 or not _numbers(row):
                continue
            if not all(math.isfinite(v) for v in row) or not 0 < row[0] < 1e10:
                continue
            values: dict[str, float | None] = {
                n: float(v) for n, v in zip(names, row[1:], strict=True)
            }
            if kind in ROW_CHECKS and not ROW_CHECKS[kind](values):
                continue
            out.append(Sample("hooks", int(row[0] * 1e9), {"kind": kind}, values))
    return out


def _sorted_ok(v: dict[str, float | None]) -> bool:
    """Whether a sorted-batches summary adds up: rows and batch at least 2, none negative."""
    return (
        (v["pads_rows"] or 0.0) >= 2
        and (v["pads_batch"] or 0.0) >= 2
        and all((v[k] or 0.0) >= 0 for k in ("pads_tokens", "pads_sq_tokens"))
    )


ROW_CHECKS = {"padding": _padding_ok, "padding_sorted": _sorted_ok}


def _numbers(values: list) -> bool:
    """Whether every value is a finite number a float can hold (not 1e400, NaN or 10**400)."""
    for v in values:
        if not isinstance(v, (int, float)):
            return False
        try:
            finite_number(v)
        except (ValueError, OverflowError):
            return False
    return True
