"""Stack probe: py-spy samples of the target's Python threads (and its Python children).

py-spy `record` writes its output only when it ends, so the probe samples in rolling
windows: each window runs `py-spy record --format raw` for `window_s` seconds and turns
the collapsed stacks into samples. Two recorders run side by side in every window:

* mode "all": every thread of the job's process at every tick, idle ones included
  (`--idle`). A training thread blocked on the DataLoader's queue is idle, and without
  `--idle` that time would vanish from the breakdown.
* mode "gil": only the thread holding the GIL at each tick (`--gil`), at a lower rate.
  It says who holds the GIL, which is what GIL contention needs.

The job's child processes (DataLoader workers) are recorded beside them, one (or a few) per
window in turns at a lower rate: what workers do is a question of shares, and sampling every
worker at the loop's rate would cost a core on a box with many workers. Their counts are
weighted to stand for all workers at the loop rate (label `role` "worker", value `weight`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from gpudiag.probes.base import Probe, ProbeStatus, Sample, Target, now_ns
from gpudiag.probes.files import descendants, open_regular_fd
from gpudiag.probes.servers.triton import model_process
from gpudiag.probes.spawn import run_process, start_process
from gpudiag.probes.stacks.pace import Pace
from gpudiag.probes.stacks.pyspy import (
    SpyRun,
    crash_reason,
    diagnose_py_spy_error,
    find_py_spy,
    process_age_s,
    process_alive,
    wait_recorder,
    watch_memory,
)
from gpudiag.probes.stacks.pyspy_output import (
    Episode,
    SourceLines,
    StackRow,
    parse_raw,
    parse_speedscope,
)
from gpudiag.probes.stacks.rates import StackRates, thread_count
from gpudiag.probes.stacks.samples import (
    STACK_FIELDS,
    Tally,
    WorkersTurn,
    episode_sample,
    module_call_sites,
    source_sample,
    stack_sample,
    window_sample,
    workers_window_sample,
)

MAX_CALL_SOURCES = 2000  # module-call lines whose text is sent, per probe

PACE_HINT = (
    "give watch a larger --cpu-budget, or fewer jobs to share it (--max-jobs, --match); "
    "py-spy's cost per tick grows with the job's threads"
)

STARVED_BELOW = 0.5  # the analyzers' stack_rate_min default: py-spy starved below this share
STARVED_MIN_ASKED = 200  # ticks asked before falling behind is judged (2 s at 100 Hz): a job
# that crashed at once left py-spy a fraction of a window, and "profile longer" was its fix


@dataclass(frozen=True)
class StackConfig:
    """The stack probe's rates and windows, as configured (the budget level scales the rates
    from there): the loop's rate, the window's length, the --gil recorder's rate (0: none),
    py-spy's --nonblocking, whether the job's children are recorded, how long py-spy waits for a
    young interpreter, the workers' rate and how many are recorded per window, the lowest
    loop rate the budget may scale to, and whether the probe rests between windows when even
    that costs more than its CPU goal (probes/stacks/pace.py; `watch`)."""

    rate_hz: int = 100
    window_s: float = 3.0
    gil_rate_hz: int = 25
    nonblocking: bool = True
    subprocesses: bool = True
    startup_timeout_s: float = 10.0
    worker_rate_hz: int = 20
    workers_per_window: int = 1
    min_rate_hz: int = 5
    pace: bool = False  # below the lowest rates, rest between windows to keep the CPU goal


class StackProbe(StackRates, Probe):  # type: ignore[misc]  # level: a float here, Probe allows None
    """Samples Python stacks of the target with py-spy, in rolling windows.

    The loop process is recorded at `rate_hz` (scaled by the budget level); the job's child
    processes (DataLoader workers) are recorded in turns, `workers_per_window` of them per
    window at `worker_rate_hz`, and their counts are weighted so that they estimate what
    recording every worker at the loop rate would have counted:
    weight = (workers alive / workers recorded) x (loop rate / worker rate).
    """

    name = "stacks"
    adaptive = True
    interval_s = 0.5
    buffered = True  # samples arrive per window; drain once more after close()
    fields = STACK_FIELDS

    def __init__(self, config: StackConfig | None = None) -> None:
        c = config or StackConfig()
        self.rate_hz = c.rate_hz
        self.gil_rate_hz = c.gil_rate_hz
        self.worker_rate_hz = c.worker_rate_hz
        self.workers_per_window = c.workers_per_window
        self.min_rate_hz = min(c.min_rate_hz, c.rate_hz)
        self.window_s = c.window_s
        self.nonblocking = c.nonblocking
        self.subprocesses = c.subprocesses
        self.startup_timeout_s = c.startup_timeout_s
        self.level = 1.0
        self.cpu_goal: float | None = None  # cores py-spy may use; set by the budget governor
        self.target: Target | None = None
        self.followed: int | None = None  # the child whose stacks are the loop's (follow())
        self._cut = False  # the window in progress was cut by follow(): dropped
        self._exe: str | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[Sample] = []
        self._procs: list[subprocess.Popen] = []
        self._turn = 0
        self.lean = False
        self._unreadable: set[int] = set()
        self.spy_cpu_s = 0.0  # CPU of every finished py-spy recorder
        self.spy_window_rss = 0  # py-spy's peak RSS in the last window, all recorders
        self.last_error: str | None = None
        self.last_hint: str | None = None
        self.windows_read = self.windows_failed = 0  # windows whose loop recording was read
        self.ticks = self.ticks_asked = 0.0  # loop recordings' ticks, and what was asked for
        self._sources = SourceLines()
        self._call_lines: set[tuple[int, str]] = set()  # module-call lines already sent
        self.pace: Pace | None = Pace() if c.pace else None  # None: never rests (attach)
        self._notes: list[str] = []

    # ---- lifecycle ----------------------------------------------------------------------
    def open(self, target: Target) -> ProbeStatus:
        """Check py-spy can read the target (retrying while a young interpreter starts)."""
        self.target = target
        self._exe = find_py_spy()
        if self._exe is None:
            return ProbeStatus(
                self.name,
                False,
                "py-spy executable not found",
                "pip install py-spy (it is a dependency of gpudiag)",
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            stub = model_process(target.pid)  # a tritonserver: its Python models' process
            if stub is not None:
                self.followed = stub
            try:
                res = run_process(
                    [self._exe, "dump", "--pid", str(self.loop_pid)],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
            except subprocess.TimeoutExpired:
                return ProbeStatus(self.name, False, "py-spy dump timed out", None)
            if res.returncode == 0:
                break
            reason, hint = diagnose_py_spy_error(res.stderr + res.stdout, target.pid)
            # a young interpreter may not be readable yet (no version symbol, stacks
            # changing under a read): retry; permission errors never get better
            retryable = "permission" not in reason and process_age_s(target.pid) < 30
            if not retryable or time.monotonic() > deadline or not process_alive(target.pid):
                return ProbeStatus(self.name, False, reason, hint)
            time.sleep(0.3)
        if self.cpu_goal is not None:  # a first guess; the governor corrects it from measurements
            est = self.estimate_cost(self.level)
            if est > self.cpu_goal:
                self.set_level(self.level * self.cpu_goal / est)
        self._tmp = tempfile.TemporaryDirectory(prefix="gpudiag-stacks-")
        self._thread = threading.Thread(target=self._loop, name="gpudiag-stacks", daemon=True)
        self._thread.start()
        return ProbeStatus(self.name, True)

    def _cmd(self, run: SpyRun, duration: float) -> list[str]:
        assert self._exe
        fmt = "raw" if run.mode == "gil" else "speedscope"
        cmd = [
            self._exe,
            "record",
            "--pid",
            str(run.pid),
            "--format",
            fmt,
            "--threads",
            "--full-filenames",
            "--rate",
            str(run.rate),
            "--duration",
            str(max(1, round(duration))),
            "--output",
            run.out,
        ]
        cmd.append("--gil" if run.mode == "gil" else "--idle")
        if self.nonblocking:
            cmd.append("--nonblocking")
        return cmd

    @property
    def loop_pid(self) -> int:
        """The process recorded as the loop's: the target, or the child follow() named."""
        assert self.target is not None
        return self.followed if self.followed is not None else self.target.pid

    def follow(self, pid: int) -> None:
        """Record `pid` (a child of the target that does the job's work: a reloader's or a
        supervisor's server) as the loop's process from now on; the window in progress, of
        the process that only waits on it, is cut and dropped."""
        if pid == self.loop_pid:
            return
        with self._lock:
            self.followed = pid
            self._cut = True
            procs = list(self._procs)
        _interrupt(procs)

    def _workers(self) -> list[int]:
        """The target's child processes (DataLoader workers), oldest first; not the one
        followed as the loop's."""
        assert self.target is not None
        skip = self._unreadable | {self.loop_pid}
        return sorted(k for k in descendants(self.target.pid) if k not in skip)

    def _plan(self, n: int) -> tuple[list[SpyRun], int]:
        """The recorders of window n, and how many workers were alive."""
        assert self._tmp is not None and self.target is not None
        r = self.rates()
        runs = [
            SpyRun(
                "all",
                self.loop_pid,
                int(r["stacks_loop_hz"]),
                os.path.join(self._tmp.name, f"w{n}-all.json"),
            )
        ]
        alive = self._workers() if r["stacks_worker_hz"] > 0 else []
        gil_turn = not (self.lean and alive) or n % 2 == 1
        if r["stacks_gil_hz"] > 0 and gil_turn:
            runs.append(
                SpyRun(
                    "gil",
                    self.loop_pid,
                    int(r["stacks_gil_hz"]),
                    os.path.join(self._tmp.name, f"w{n}-gil.txt"),
                )
            )
        if self.lean and r["stacks_gil_hz"] > 0 and gil_turn:
            alive = []
        k = min(len(alive), max(1, self.workers_per_window))
        for j in range(k):
            pid = alive[(self._turn + j) % len(alive)]
            runs.append(
                SpyRun(
                    "worker",
                    pid,
                    int(r["stacks_worker_hz"]),
                    os.path.join(self._tmp.name, f"w{n}-worker{pid}.json"),
                )
            )
        self._turn += k
        return runs, len(alive)

    def _loop(self) -> None:
        assert self._tmp is not None
        n = 0
        while not self._stop.is_set() and self.target and process_alive(self.target.pid):
            n += 1
            runs, alive = self._plan(n)
            window = self.window_now()
            started = time.monotonic()
            for run in runs:
                try:
                    run.proc = start_process(
                        self._cmd(run, window),
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                except OSError as exc:
                    self.last_error = f"cannot start py-spy: {exc}"
                    return
            with self._lock:
                self._procs = [r.proc for r in runs if r.proc is not None]
            watch_memory(runs)
            for run in runs:
                wait_recorder(run)
            with self._lock:
                self._procs = []
                self.spy_cpu_s += sum(r.cpu_s for r in runs)
                self.spy_window_rss = sum(r.maxrss_bytes for r in runs)
                cut, self._cut = self._cut, False
            duration = time.monotonic() - started
            if cut:  # follow() switched processes mid-window: its samples are not the loop's
                for run in runs:
                    _unlink(run.out)
                continue
            if not self._collect(runs, alive, duration):
                if self._stop.is_set():
                    return  # close() cut a window py-spy had not written yet: not a failure
                # py-spy failed outright (target gone, or lost permission): say why, back off
                msg = runs[0].err
                if self.target and not process_alive(self.target.pid):
                    return
                if self.followed is not None and not process_alive(self.followed):
                    self.followed = None  # the child followed ended: back to the target
                    continue
                self.windows_failed += 1
                self.last_error, self.last_hint = crash_reason(msg, runs[0], self.target.pid)
                self._stop.wait(1.0)
            else:
                self.windows_read += 1
                self._pace_after(runs, duration)

    def _pace_after(self, runs: list[SpyRun], duration: float) -> None:
        """After a window read: rest as long as its py-spy CPU buys at the goal, when even
        the lowest rates cost more (or stop, past the longest rest), and say so."""
        if self.pace is None:
            return
        line = self.pace.after_window(
            sum(r.cpu_s for r in runs),
            duration,
            thread_count(self.loop_pid),
            self.cpu_goal,
            self.at_lowest(),
        )
        self._note(line)
        while self.pace.stopped and not self._stop.is_set():
            t0 = time.monotonic()
            self._stop.wait(self.pace.recheck_s)
            self.pace.rested(time.monotonic() - t0)
            threads = thread_count(self.loop_pid)
            if not threads:
                return  # the job ended: the loop sees it
            if self.pace.may_resume(threads, self.cpu_goal):
                self._note(f"stack sampling resumed: the job has {threads} threads now")
        if self.pace.rest_s > 0:
            t0 = time.monotonic()
            self._stop.wait(self.pace.rest_s)
            self.pace.rested(time.monotonic() - t0)

    def _note(self, line: str | None) -> None:
        if line:
            with self._lock:
                self._notes = [*self._notes[-9:], line]

    def notes(self) -> list[str]:
        """Lines for the log: the stacks paced, stopped, back to their rates."""
        with self._lock:
            out, self._notes = self._notes, []
        return out

    def paced(self) -> bool:
        """True while the stacks rest between windows or are stopped (probes/stacks/pace)."""
        return self.pace is not None and self.pace.paced

    def live_status(self) -> ProbeStatus | None:
        """Degraded while paced, unavailable while stopped, with why and the fix."""
        pace = self.pace
        if pace is None or not pace.paced:
            return None
        if pace.stopped:
            return ProbeStatus(self.name, False, pace.stop_line(), PACE_HINT)
        return ProbeStatus(self.name, True, pace.rest_line(), PACE_HINT)

    def _read(self, run: SpyRun) -> tuple[list[StackRow], list[Episode]] | None:
        try:
            with os.fdopen(open_regular_fd(run.out)[0]) as f:  # our own temporary folder
                if run.mode == "gil":
                    parsed: tuple[list[StackRow], list[Episode]] = parse_raw(f, run.pid), []
                else:
                    parsed = parse_speedscope(json.load(f), run.pid)
            os.unlink(run.out)
        except (OSError, ValueError):
            return None
        return parsed

    def _collect(self, runs: list[SpyRun], alive: int, duration: float) -> bool:
        """Parse a finished window's files into pending samples; False when the loop
        process's recording could not be read."""
        assert self.target is not None
        t = now_ns()
        samples: list[Sample] = []
        loop_ok = False
        loop_rate = runs[0].rate
        ticks = 0
        workers_read = [r for r in runs if r.mode == "worker"]
        weight = (
            (alive / max(1, len(workers_read))) * loop_rate / workers_read[0].rate
            if workers_read
            else 1.0
        )
        recorded = 0
        for run in runs:
            parsed = self._read(run)
            if parsed is None:
                if (
                    run.mode == "worker"
                    and "python" in run.err.lower()
                    and "version" in run.err.lower()
                ):
                    self._unreadable.add(run.pid)  # a child that is not Python
                continue
            rows, episodes = parsed
            if run.mode == "worker":
                recorded += 1
                for r in rows:
                    samples.append(
                        self._stack_sample(t, "all", r, Tally("worker", r.count * weight, weight))
                    )
                continue
            loop_ok = loop_ok or run.mode == "all"
            samples += [episode_sample(self.name, t, run.mode, e) for e in episodes]
            if run.mode == "all":
                samples += self._call_sources(t, rows)
                per_thread: dict[int, int] = {}
                for r in rows:
                    per_thread[r.tid] = per_thread.get(r.tid, 0) + r.count
                ticks = max(per_thread.values(), default=0)
                self.ticks += ticks
                self.ticks_asked += duration * run.rate
            for r in rows:
                samples.append(self._stack_sample(t, run.mode, r, Tally("target", float(r.count))))
            n = ticks if run.mode == "all" else round(ticks * run.rate / loop_rate)
            samples.append(window_sample(self.name, t, run, n, duration))
        if workers_read:
            samples.append(
                workers_window_sample(
                    self.name,
                    t,
                    duration,
                    WorkersTurn(workers_read[0].rate, alive, recorded, weight),
                )
            )
        with self._lock:
            self._pending.extend(samples)
        return loop_ok

    def _call_sources(self, t: int, rows: list[StackRow]) -> list[Sample]:
        """The text of each line seen calling a torch module, once per process and line (at
        most MAX_CALL_SOURCES): the stacks' split of the model's time names calls by it."""
        out = []
        for r in rows:
            for frame in module_call_sites(r.frames):
                key = (r.pid, frame)
                if key in self._call_lines or len(self._call_lines) >= MAX_CALL_SOURCES:
                    continue
                self._call_lines.add(key)
                code = self._sources.line(r.pid, frame)
                if code:
                    out.append(source_sample(self.name, t, frame, code))
        return out

    def _stack_sample(self, t: int, mode: str, r: StackRow, tally: Tally) -> Sample:
        code = self._sources.line(r.pid, r.frames[-1]) if r.frames else ""
        return stack_sample(self.name, t, mode, r, code, tally)

    def problems(self) -> list[str]:
        """Why py-spy last failed, if it did."""
        return [self.last_error] if self.last_error else []

    def achieved(self) -> float | None:
        """The share of the ticks asked for that py-spy recorded (None before a window)."""
        return min(1.0, self.ticks / self.ticks_asked) if self.ticks_asked > 0 else None

    def _starved(self) -> ProbeStatus | None:
        """Degraded when the box starved py-spy of CPU: it fell behind its rate."""
        got = self.achieved()
        if got is None or got >= STARVED_BELOW or self.ticks_asked < STARVED_MIN_ASKED:
            return None
        return ProbeStatus(
            self.name,
            True,
            f"sampling fell behind: py-spy recorded {got:.0%} of the ticks asked for "
            f"({self.ticks:.0f} of {self.ticks_asked:.0f}); the box is too busy to give it "
            "CPU on time, so the verdict counts the samples at that share",
            "give gpudiag CPU: run it at a higher priority (sudo nice -n -5 gpudiag ...), "
            "keep a core free for it (taskset the other work), or profile longer (--duration)",
        )

    def final_status(self) -> ProbeStatus | None:
        """Unavailable (py-spy failed in every window) or degraded, with why and the fix."""
        if not self.windows_failed or not self.last_error:
            return self.live_status() or self._paced_before() or self._starved()
        if not self.windows_read:
            return ProbeStatus(
                self.name,
                False,
                f"py-spy failed in every window: {self.last_error}",
                self.last_hint,
            )
        total = self.windows_read + self.windows_failed
        return ProbeStatus(
            self.name,
            True,
            f"py-spy failed in {self.windows_failed} of {total} windows: {self.last_error}",
            self.last_hint,
        )

    def _paced_before(self) -> ProbeStatus | None:
        """Degraded when it was paced at some time, and back to its rates since."""
        pace = self.pace
        if pace is None or pace.share() >= 1.0:
            return None
        return ProbeStatus(
            self.name,
            True,
            f"stack sampling was paced by its share of the CPU budget: it recorded "
            f"{pace.share():.0%} of the time",
            PACE_HINT,
        )

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
        _interrupt(procs)
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _interrupt(procs: list[subprocess.Popen]) -> None:
    """End py-spy recorders' windows early (SIGINT: each still writes what it has)."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGINT)
            except OSError:
                pass
