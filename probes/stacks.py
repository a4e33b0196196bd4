"""Stack probe: py-spy samples of the target's Python threads (and its Python children).

py-spy `record` writes its output only when it ends, so the probe samples in rolling
windows: each window runs `py-spy record --format raw` for `window_s` seconds and turns
the collapsed stacks into samples. Two recorders run side by side in every window:

* mode "all": every thread at every tick, idle ones included (`--idle`), children too
  (`--subprocesses`). A training thread blocked on the DataLoader's queue is idle, and
  without `--idle` that time would vanish from the breakdown.
* mode "gil": only the thread holding the GIL at each tick (`--gil`), at a lower rate.
  It says who holds the GIL, which is what GIL contention needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpudiag.probes.base import Field, ProbeStatus, Sample, Target, now_ns

_PROCESS_RE = re.compile(r'^process (\d+):"(.*?)"$')
_PROFILE_RE = re.compile(r'^(?:Process (\d+) )?Thread (0x[0-9a-fA-F]+|\d+)(?: "(.*)")?')
_LIB_RE = re.compile(r"/lib/python\d+(\.\d+)?/|/site-packages/|/dist-packages/|^<")
_THREAD_RE = re.compile(r"^thread \((0x[0-9a-fA-F]+|\d+)\)(?::\s*(.*))?$")

PTRACE_HINT = ("run gpudiag as root, or allow ptrace: "
               "`echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope`, or "
               "`sudo setcap cap_sys_ptrace+ep $(which py-spy)`; "
               "in Docker add `--cap-add SYS_PTRACE`")


@dataclass(frozen=True)
class StackRow:
    """One collapsed stack from py-spy: which process and thread, root-to-leaf frames, count."""

    pid: int
    tid: int
    thread: str
    frames: tuple[str, ...]
    count: int


def parse_raw(lines: Iterable[str], default_pid: int) -> list[StackRow]:
    """Parse py-spy's raw (collapsed) output, with or without process and thread frames."""
    rows: list[StackRow] = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        head, _, count_s = line.rpartition(" ")
        try:
            count = int(count_s)
        except ValueError:
            continue
        pid, tid, thread = default_pid, 0, ""
        parts = head.split(";")
        i = 0
        if parts and (m := _PROCESS_RE.match(parts[0])):
            pid = int(m.group(1))
            i = 1
        if i < len(parts) and (m := _THREAD_RE.match(parts[i])):
            tid = int(m.group(1), 0)
            thread = (m.group(2) or "").strip()
            i += 1
        rows.append(StackRow(pid, tid, thread, tuple(parts[i:]), count))
    return rows


def is_library_frame(frame: str) -> bool:
    """True when a 'func (file:line)' frame is in the standard library or an installed package."""
    lpar = frame.rfind(" (")
    path = frame[lpar + 2:] if lpar >= 0 else frame
    return bool(_LIB_RE.search(path))


def episode_anchor(frames: tuple[str, ...]) -> str | None:
    """The user-code call into a library that a stack is inside, without the library's line.

    Consecutive samples with the same anchor are one episode of that call (one torch.save,
    one fetch of a batch): counting episodes tells how often a call runs and how long each takes.
    """
    for i, frame in enumerate(frames):
        if i > 0 and is_library_frame(frame) and not is_library_frame(frames[i - 1]):
            lpar = frame.rfind(" (")
            colon = frame.rfind(":")
            entry = frame[:colon] + ")" if lpar >= 0 and colon > lpar else frame
            return ";".join(frames[:i] + (entry,))
    return None


@dataclass(frozen=True)
class Episode:
    """Runs of consecutive samples of one thread inside one library call (see episode_anchor)."""

    pid: int
    tid: int
    thread: str
    anchor: str
    episodes: int
    count: int


def parse_speedscope(doc: dict, default_pid: int) -> tuple[list[StackRow], list[Episode]]:
    """Parse py-spy's speedscope output into stack counts and call episodes per thread."""
    frames_tbl = doc.get("shared", {}).get("frames", [])
    names = []
    for fr in frames_tbl:
        line = fr.get("line")
        loc = f"{fr.get('file', '?')}:{line}" if line is not None else str(fr.get("file", "?"))
        names.append(f"{fr.get('name', '?')} ({loc})")
    rows: list[StackRow] = []
    episodes: list[Episode] = []
    for prof in doc.get("profiles", []):
        m = _PROFILE_RE.match(prof.get("name", ""))
        pid = int(m.group(1)) if m and m.group(1) else default_pid
        tid = int(m.group(2), 0) if m else 0
        thread = (m.group(3) or "") if m else ""
        counts: dict[tuple[str, ...], int] = {}
        ep_runs: dict[str, list[int]] = {}
        prev_anchor: str | None = None
        for idx in prof.get("samples", []):
            # speedscope lists frames root first
            stack = tuple(names[i] for i in idx if 0 <= i < len(names))
            counts[stack] = counts.get(stack, 0) + 1
            if pid != default_pid:
                continue
            anchor = episode_anchor(stack)
            if anchor is not None:
                runs = ep_runs.setdefault(anchor, [0, 0])
                runs[1] += 1
                if anchor != prev_anchor:
                    runs[0] += 1
            prev_anchor = anchor
        rows.extend(StackRow(pid, tid, thread, st, c) for st, c in counts.items())
        episodes.extend(Episode(pid, tid, thread, a, r[0], r[1]) for a, r in ep_runs.items())
    return rows, episodes


class SourceLines:
    """Reads the source line a frame points at (through /proc/PID/root for containers)."""

    def __init__(self, max_entries: int = 20000) -> None:
        self._cache: dict[tuple[str, int], str] = {}
        self._files: dict[str, list[str] | None] = {}
        self.max_entries = max_entries

    def line(self, pid: int, frame: str) -> str:
        """The stripped source text of a 'func (file:line)' frame, '' when unknown."""
        lpar = frame.rfind(" (")
        colon = frame.rfind(":")
        if lpar < 0 or colon < lpar:
            return ""
        path = frame[lpar + 2:colon]
        try:
            lineno = int(frame[colon + 1:].rstrip(")"))
        except ValueError:
            return ""
        key = (path, lineno)
        if key in self._cache:
            return self._cache[key]
        if path not in self._files:
            lines = None
            for cand in (path, f"/proc/{pid}/root{path}"):
                try:
                    with open(cand, encoding="utf-8", errors="replace") as f:
                        lines = f.readlines()
                    break
                except OSError:
                    continue
            if len(self._files) > 2000:
                self._files.clear()
            self._files[path] = lines
        lines = self._files[path]
        text = lines[lineno - 1].strip()[:200] if lines and 0 < lineno <= len(lines) else ""
        if len(self._cache) < self.max_entries:
            self._cache[key] = text
        return text


def find_py_spy() -> str | None:
    """Locate the py-spy executable: next to this Python first (a venv), then on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


def diagnose_py_spy_error(text: str, pid: int) -> tuple[str, str | None]:
    """Turn py-spy's error output into (reason, hint) a user can act on."""
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return (f"no permission to read the memory of pid {pid} (ptrace)", PTRACE_HINT)
    if "failed to find python version" in low or "failed to get process executable" in low:
        return (f"pid {pid} is not a Python process (py-spy found no interpreter)",
                "attach to the Python process of the job (the one running the training loop)")
    if "no such process" in low or "failed to open process" in low:
        return (f"no process with pid {pid}", None)
    last = [ln for ln in text.strip().splitlines() if ln.strip()]
    return ((last[0] if last else "py-spy failed").strip()[:300], None)


class StackProbe:
    """Samples Python stacks of the target with py-spy, in rolling windows."""

    name = "stacks"
    interval_s = 0.5
    buffered = True  # samples arrive per window; drain once more after close()
    fields = (
        Field("count", "samples", "counter", "stack samples of one thread with one stack"),
        Field("ticks", "samples", "counter", "sampling ticks in a window"),
        Field("duration_s", "s", "gauge", "length of a sampling window"),
        Field("rate_hz", "Hz", "gauge", "sampling rate of a window"),
        Field("errors", "count", "counter", "samples py-spy failed to take in a window"),
        Field("episodes", "count", "counter", "separate runs of samples inside one library call"),
    )

    def __init__(self, rate_hz: int = 100, window_s: float = 3.0, gil_rate_hz: int = 25,
                 nonblocking: bool = True, subprocesses: bool = True,
                 startup_timeout_s: float = 10.0) -> None:
        self.rate_hz = rate_hz
        self.gil_rate_hz = gil_rate_hz
        self.window_s = window_s
        self.nonblocking = nonblocking
        self.subprocesses = subprocesses
        self.startup_timeout_s = startup_timeout_s
        self.target: Target | None = None
        self._exe: str | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[Sample] = []
        self._procs: list[subprocess.Popen] = []
        self.last_error: str | None = None
        self._sources = SourceLines()

    def open(self, target: Target) -> ProbeStatus:
        """Check py-spy can read the target (retrying while a young interpreter starts)."""
        self.target = target
        self._exe = find_py_spy()
        if self._exe is None:
            return ProbeStatus(self.name, False, "py-spy executable not found",
                               "pip install py-spy (it is a dependency of gpudiag)")
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                res = subprocess.run([self._exe, "dump", "--pid", str(target.pid)],
                                     capture_output=True, text=True, timeout=30)
            except subprocess.TimeoutExpired:
                return ProbeStatus(self.name, False, "py-spy dump timed out", None)
            if res.returncode == 0:
                break
            reason, hint = diagnose_py_spy_error(res.stderr + res.stdout, target.pid)
            # a young interpreter may not be readable yet (no version symbol, stacks
            # changing under a read): retry; permission errors never get better
            retryable = "permission" not in reason and _process_age_s(target.pid) < 30
            if not retryable or time.monotonic() > deadline or not _alive(target.pid):
                return ProbeStatus(self.name, False, reason, hint)
            time.sleep(0.3)
        self._tmp = tempfile.TemporaryDirectory(prefix="gpudiag-stacks-")
        self._thread = threading.Thread(target=self._loop, name="gpudiag-stacks", daemon=True)
        self._thread.start()
        return ProbeStatus(self.name, True)

    def _cmd(self, mode: str, out: str, duration: float) -> list[str]:
        assert self._exe and self.target
        rate = self.rate_hz if mode == "all" else self.gil_rate_hz
        fmt = "speedscope" if mode == "all" else "raw"
        cmd = [self._exe, "record", "--pid", str(self.target.pid), "--format", fmt,
               "--threads", "--full-filenames", "--rate", str(rate),
               "--duration", str(max(1, round(duration))), "--output", out]
        if mode == "all":
            cmd.append("--idle")
            if self.subprocesses:
                cmd.append("--subprocesses")
        else:
            cmd.append("--gil")
        if self.nonblocking:
            cmd.append("--nonblocking")
        return cmd

    def _loop(self) -> None:
        assert self._tmp is not None
        n = 0
        while not self._stop.is_set() and self.target and _alive(self.target.pid):
            n += 1
            modes = ["all"] + (["gil"] if self.gil_rate_hz > 0 else [])
            outs = {m: os.path.join(self._tmp.name, f"w{n}-{m}.txt") for m in modes}
            started = time.monotonic()
            procs = {}
            for m in modes:
                try:
                    procs[m] = subprocess.Popen(self._cmd(m, outs[m], self.window_s),
                                                stdout=subprocess.DEVNULL,
                                                stderr=subprocess.PIPE, text=True)
                except OSError as exc:
                    self.last_error = f"cannot start py-spy: {exc}"
                    return
            with self._lock:
                self._procs = list(procs.values())
            errs = {m: p.communicate()[1] or "" for m, p in procs.items()}
            with self._lock:
                self._procs = []
            duration = time.monotonic() - started
            if not self._collect(outs, errs, duration):
                # py-spy failed outright (target gone, or lost permission): say why, back off
                msg = errs.get("all", "")
                if self.target and not _alive(self.target.pid):
                    return
                self.last_error = diagnose_py_spy_error(msg, self.target.pid)[0]
                self._stop.wait(1.0)

    def _collect(self, outs: dict[str, str], errs: dict[str, str], duration: float) -> bool:
        """Parse a finished window's files into pending samples; False when none could be read."""
        assert self.target is not None
        t = now_ns()
        samples: list[Sample] = []
        ticks = 0
        for mode, path in outs.items():
            episodes: list[Episode] = []
            try:
                with open(path) as f:
                    if mode == "all":
                        rows, episodes = parse_speedscope(json.load(f), self.target.pid)
                    else:
                        rows = parse_raw(f, self.target.pid)
                os.unlink(path)
            except (OSError, ValueError):
                continue
            for e in episodes:
                samples.append(Sample(self.name, t, {
                    "mode": mode, "kind": "episode", "pid": str(e.pid), "tid": str(e.tid),
                    "thread": e.thread, "anchor": e.anchor},
                    {"episodes": float(e.episodes), "count": float(e.count)}))
            if mode == "all":
                per_thread: dict[int, int] = {}
                for r in rows:
                    if r.pid == self.target.pid:
                        per_thread[r.tid] = per_thread.get(r.tid, 0) + r.count
                ticks = max(per_thread.values(), default=0)
            for r in rows:
                samples.append(Sample(self.name, t, {
                    "mode": mode, "kind": "stack", "pid": str(r.pid), "tid": str(r.tid),
                    "thread": r.thread,
                    "role": "target" if r.pid == self.target.pid else "worker",
                    "stack": ";".join(r.frames),
                    "code": self._sources.line(r.pid, r.frames[-1]) if r.frames else ""},
                    {"count": float(r.count)}))
            m = re.search(r"Errors:\s*(\d+)", errs.get(mode, ""))
            rate = self.rate_hz if mode == "all" else self.gil_rate_hz
            samples.append(Sample(self.name, t, {"mode": mode, "kind": "window"}, {
                "ticks": float(ticks if mode == "all" else round(ticks * rate / self.rate_hz)),
                "duration_s": duration, "rate_hz": float(rate),
                "errors": float(m.group(1)) if m else 0.0}))
        with self._lock:
            self._pending.extend(samples)
        return bool(samples)

    def sample(self) -> list[Sample]:
        """Return the samples of the windows finished since the last call."""
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def close(self) -> None:
        """Stop sampling; the window in progress is ended early and still collected."""
        self._stop.set()
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGINT)
                except OSError:
                    pass
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _process_age_s(pid: int) -> float:
    try:
        import psutil

        return time.time() - psutil.Process(pid).create_time()
    except Exception:
        return 1e9
