"""A profiling session: open the probes on a target, sample until a stop condition, analyse.

Each probe samples on its own thread at its own interval, so a slow probe never delays the
others. Whatever ends the session (the job exits, --duration passes, Ctrl-C, SIGTERM, a probe
failing), the collected samples are analysed and the report is written.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpudiag.agent.base.config import Settings
from gpudiag.agent.output.result import SessionResult
from gpudiag.agent.session.autocapture import AutoCapture
from gpudiag.agent.session.budget import Budget, Governor, loop_window_samples
from gpudiag.agent.session.ranks.rankset import RankSet, setup_ranks
from gpudiag.agent.session.setup import (
    SessionOptions,
    Subject,
    make_probes,
    open_probe,
)
from gpudiag.agent.session.signals import StopSignals
from gpudiag.agent.session.targetwatch import HangWatch, TargetWatch, running
from gpudiag.agent.session.workers import roles_of
from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import Probe, ProbeStatus, Sample, Target
from gpudiag.probes.dist.ranks import RankInfo
from gpudiag.probes.inprocess.channel import WORK_KINDS, HookProbe
from gpudiag.probes.inprocess.isolation import hooks_blocked
from gpudiag.probes.stacks.probe import StackProbe
from gpudiag.text.sink import say

if TYPE_CHECKING:
    from gpudiag.analyzers import Analysis

__all__ = [
    "Session",
    "SessionOptions",
    "SessionParts",
    "SessionResult",
    "Subject",
    "make_probes",
]


SURE_CHECK_S = 3.0  # --until-sure: how often the verdict so far is looked at
# --duration counts from the first unit of work: once the hooks are heard from (the job
# imported torch), the clock waits this long after launch for it (a torch.compile before the
# first step took 20-90 s here, 33-53 s on an H100); then it counts from launch
STARTUP_WAIT_S = 600.0
LOOP_KINDS = WORK_KINDS  # hooks' samples of the work the job repeats
RankPlan = tuple[list[RankInfo], int]  # the ranks of a multi-rank job, and its root pid


def analyze(*args: Any, **kw: Any) -> Analysis:
    """`gpudiag.analyzers.analyze`, loaded on first use: the engine and every finding load
    with the first analysis, not with this module (`gpudiag mcp` starts without them)."""
    from gpudiag.analyzers import analyze as run

    return run(*args, **kw)


class _Interrupted(Exception):
    pass


@dataclass(frozen=True)
class SessionParts:
    """What a session is given beside its target, settings and options (all optional): its
    `probes` (else make_probes(opts, hooks)), the job's `popen` when it was launched, the
    `sink` every sample also goes to, its `log`, the job's in-process `hooks`, `ranks` to
    follow every rank of a job, `opened` probes already opened with their status,
    `stop_signals` (run/attach: the signals as a flag), the `timeline` to fill (a recorder
    reads its segment length), `on_hang` for a multi-rank job's hang, and `governor` (else
    the budget of the options)."""

    probes: list[Probe] | None = None
    popen: subprocess.Popen | None = None
    sink: Callable[[list[Sample]], None] | None = None
    log: Callable[[str], None] | None = None
    hooks: HookProbe | None = None
    ranks: RankPlan | None = None
    opened: dict[str, ProbeStatus] | None = None
    stop_signals: StopSignals | None = None
    timeline: Timeline | None = None
    on_hang: Callable[[Session], None] | None = None
    governor: Callable[[list[Probe]], Governor] | None = None


class Session:
    """Samples one target with a set of probes into a timeline."""

    def __init__(
        self,
        target: Target,
        settings: Settings,
        opts: SessionOptions,
        parts: SessionParts | None = None,
    ) -> None:
        """Everything a session needs, given here (nothing is set on it afterwards): its
        target, settings and options, and its `parts` (SessionParts)."""
        p = parts or SessionParts()
        self.target = target
        self.settings = settings
        self.opts = opts
        n = len(p.ranks[0]) if p.ranks else 1
        self.probes = p.probes if p.probes is not None else make_probes(opts, p.hooks, n)
        if p.hooks is not None:
            p.hooks.profiled = target.pid  # its steps are the loop's, not a forked child's
        self.popen = p.popen
        self.sink = p.sink
        self.log = p.log or say
        self.timeline = p.timeline or Timeline(skip_steps=opts.skip_steps)
        self.statuses: dict[str, ProbeStatus] = dict(p.opened or {})
        self.errors: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[tuple[threading.Thread, str]] = []  # (thread, its probe's name)
        self.exit_code: int | None = None
        self.paused = False
        self.first_step_at: float | None = None  # wall time the hooks' first unit of work came
        # a server whose work runs in a child the stacks followed: its processes' roles, read
        # when followed (`workers.server_processes`; `run` reads them again at its end)
        self.roles: list[dict] | None = None
        self.start_time = time.time()
        self.stop_signals = p.stop_signals
        self.capture_steps = opts.capture_steps  # asked once the job connects (autocapture)
        self._watch: TargetWatch | None = None
        self.hangs = HangWatch(opts.probe_timeout_s)
        self.hung = self.hangs.hung  # names of probes timed out
        self.ranks: RankSet | None = None  # a multi-rank job (agent.ranks)
        if p.ranks:  # before the governor: the ranks' stack probes get its CPU goal too
            self.ranks = setup_ranks(self, *p.ranks)
            on_hang = p.on_hang
            if on_hang is not None:
                self.ranks.on_hang = lambda: on_hang(self)
        self.governor = self._governor(p.governor)

    def _governor(self, make: Callable[[list[Probe]], Governor] | None) -> Governor | None:
        """The budget governor: `make`'s, else the one of the options' CPU budget (None
        without one)."""
        if make is not None:
            return make(self.probes)
        opts = self.opts
        if opts.cpu_budget is None:
            return None
        return Governor(
            Budget(opts.cpu_budget, opts.rss_budget_bytes),
            self.probes,
            period_s=max(1.0, opts.window_s),
            verdict_samples=self.settings.thresholds.min_loop_samples,
            loop_samples=self._loop_samples,
        )

    def _verdict_sure(self) -> bool:
        """Whether what was collected so far gives a sure verdict (asked only once the budget
        has bought the verdict's samples, when a governor runs)."""
        if self.governor is not None and self.governor.early():
            return False
        analysis = self.snapshot()
        # a cause that comes every few seconds (an epoch's new workers, a save every N steps)
        # must have had the time to show itself before a verdict stops the look
        loop_s = (analysis.phases or {}).get("loop_s") or 0.0
        if loop_s < self.settings.thresholds.sure_min_loop_s:
            return False
        return bool(analysis.verdict.get("sure"))

    def _loop_samples(self) -> float:
        with self._lock:  # the governor's thread; the timeline is filled meanwhile
            return loop_window_samples(self.timeline, Classifier(self.settings.rules))

    # ---- probes -------------------------------------------------------------------------
    def open_probe(self, probe: Probe) -> ProbeStatus:
        """Open one probe, turning an unexpected exception into an unavailable status."""
        status = open_probe(probe, self.target)
        if probe.name not in self.hung:
            self.statuses[probe.name] = status
        return status

    def _ingest(self, samples: list[Sample]) -> None:
        if not samples or self.paused:
            return
        with self._lock:  # the recording keeps the order the timeline saw
            if self.ranks is not None:  # a multi-rank job: each rank's own timeline too
                samples, _others = self.ranks.route(samples)  # a recording: the main rank
            self.timeline.extend(samples)
            if self.first_step_at is None and any(
                s.probe == "hooks" and s.labels.get("kind") in LOOP_KINDS for s in samples
            ):
                self.first_step_at = time.time()
            if self.sink is not None:
                self.sink(samples)
        if self.ranks is None and any(s.probe == "hooks" for s in samples):
            self._follow_work()

    def _follow_work(self) -> None:
        """When the job's work (the hooks' steps, forwards, requests) comes from a child of
        the target and none from the target (a Werkzeug reloader's, uvicorn's or gunicorn's
        server under its supervisor), the stacks follow that child: the target only waits."""
        hooks = next((p for p in self.probes if isinstance(p, HookProbe)), None)
        stacks = next((p for p in self.probes if isinstance(p, StackProbe)), None)
        if hooks is None or stacks is None:
            return
        pid = hooks.worker(self.target.pid, stacks.followed)
        if pid is None or not descends_from(pid, self.target.pid):
            return
        stacks.follow(pid)
        self.roles = roles_of(self.target.pid) or self.roles
        self.log(
            f"the work runs in pid {pid}, a child of pid {self.target.pid} (which only "
            "supervises it, e.g. a reloader): its stacks are the loop's from now on"
        )

    def _run_probe(self, probe: Probe) -> None:
        while not self._stop.is_set() and probe.name not in self.hung:
            t0 = self.hangs.begin(probe.name)
            try:
                samples = probe.sample()
            except Exception as exc:
                self.error(probe.name, f"stopped sampling: {type(exc).__name__}: {exc}")
                return
            finally:
                self.hangs.end(probe.name)
            if probe.name in self.hung:
                return  # timed out meanwhile: what it returns late is dropped
            self._ingest(samples)
            for line in probe.notes():  # how it samples changed (the stacks paced)
                self.log(f"{probe.name}: {line}")
            self._stop.wait(max(0.0, probe.interval_s - (time.monotonic() - t0)))

    def start_probe(self, probe: Probe) -> None:
        """Start a sampling thread for an opened, available probe."""
        th = threading.Thread(
            target=self._run_probe, args=(probe,), name=f"gpudiag-{probe.name}", daemon=True
        )
        th.start()
        self._threads.append((th, probe.name))

    def _open_and_start(self, probe: Probe) -> None:
        if self.open_probe(probe).available and not self._stop.is_set():
            self.start_probe(probe)

    def error(self, source: str, message: str) -> None:
        """Record an error; it goes into the report."""
        from gpudiag.agent.output.report import iso

        self.errors.append({"source": source, "message": message, "t": iso(time.time())})
        self.log(f"{source}: {message}")

    # ---- lifecycle ----------------------------------------------------------------------
    def target_alive(self) -> bool:
        """Whether the job still runs (for a launched job, reaps it and keeps its exit code);
        a pid that now runs another program (exec) or belongs to a new process counts as
        ended, and the report's errors say which."""
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                self._ended(code)
                return False
            if self.popen.pid != self.target.pid:
                return True  # a launcher's Python child: followed through the launcher
        if not running(self.target.pid):
            self._reap()
            return False
        why = self._watch.changed() if self._watch is not None else None
        if why is not None:
            self.error("target", why)
            return False
        return True

    def _ended(self, code: int) -> None:
        """The launched job's exit code kept; a signal that killed it is an error."""
        self.exit_code = code
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else code
            self.error("target", f"the job was killed by {name}")

    def _reap(self) -> None:
        """The launched job died between poll() and the look at its pid (a zombie, e.g.
        SIGKILLed): reap it, so its exit code is never lost (it gave exit 0)."""
        if self.popen is None or self.popen.pid != self.target.pid:
            return
        try:
            self._ended(self.popen.wait(timeout=2.0))
        except subprocess.TimeoutExpired:
            pass

    def run(self, preopened: dict[str, ProbeStatus] | None = None) -> SessionResult:
        """Sample until a stop condition; then close the probes and analyse."""
        start = self.start_time = time.time()
        self._watch = TargetWatch(self.target.pid)
        self.statuses.update(preopened or {})
        for probe in self.probes:
            if probe.name in self.statuses:
                if self.statuses[probe.name].available:
                    self.start_probe(probe)
            else:
                th = threading.Thread(
                    target=self._open_and_start,
                    args=(probe,),
                    daemon=True,
                    name=f"gpudiag-open-{probe.name}",
                )
                th.start()
                self._threads.append((th, probe.name))
        if self.governor is not None:
            self.governor.start()
        if self.ranks is not None:
            self.ranks.start(self.settings.thresholds)
        reason = self._wait(start)
        return self.finish(start, reason)

    def _wait(self, start: float) -> str:
        old_term = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):
            raise _Interrupted()

        own_handler = (
            self.stop_signals is None and threading.current_thread() is threading.main_thread()
        )
        if own_handler:
            signal.signal(signal.SIGTERM, on_term)
        auto = AutoCapture(self)
        try:
            return self._look_until_done(start, auto)
        except (KeyboardInterrupt, _Interrupted):
            if self.popen is not None:
                # the job got the same Ctrl-C; give it a moment to exit so its code is kept
                try:
                    self.exit_code = self.popen.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    pass
            return "interrupted"
        finally:
            if own_handler:
                signal.signal(signal.SIGTERM, old_term)

    def _look_until_done(self, start: float, auto: AutoCapture) -> str:
        """Look every 0.2 s until something ends the session; why it ended (_Interrupted
        when the stop signals say so)."""
        next_progress = next_sure = time.monotonic() + 5.0
        while True:
            if self.stop_signals is not None and self.stop_signals.stopping:
                raise _Interrupted()
            self.check_hung()
            auto.tick()
            if not self.target_alive():
                return "target_exited"
            elapsed = time.time() - start
            if self.opts.duration_s is not None and self.looked(start) >= self.opts.duration_s:
                return "duration_reached"
            if self.opts.until_sure and time.monotonic() >= next_sure:
                next_sure = time.monotonic() + SURE_CHECK_S
                if self._verdict_sure():
                    return "verdict_sure"
            if self._stop.wait(0.2):
                return "stopped"
            if self.opts.progress and time.monotonic() >= next_progress:
                next_progress += 5.0
                self.log(self.progress_line(elapsed))

    def looked(self, start: float) -> float:
        """Seconds the --duration clock has run: from launch, restarted at the job's first
        step (start-up is not the loop: a 23 s torch import left 2 s of a 25 s look); held at
        0 while the hooks are heard from but no step came yet (a torch.compile before the
        first step), up to STARTUP_WAIT_S after launch; from the start for an attached job
        (its loop runs already)."""
        now = time.time()
        if self.opts.attached:
            return now - start
        if self.first_step_at is not None:
            return now - self.first_step_at
        if self.hooks_heard() and now - start < STARTUP_WAIT_S:
            return 0.0
        return now - start

    def hooks_heard(self) -> bool:
        """Whether the job's in-process hooks sent anything (they load with torch)."""
        return any(isinstance(p, HookProbe) and p.messages > 0 for p in self.probes)

    def check_hung(self) -> None:
        """Mark a probe whose call has run past `probe_timeout_s` as failed (see HangWatch)."""
        for name in self.hangs.overdue():
            why = f"timed out: a call took more than {self.hangs.limit_s:g} s (hung)"
            self.statuses[name] = ProbeStatus(name, False, why)
            self.error(name, f"{why}; marked failed, the rest went on")

    def progress_line(self, elapsed: float) -> str:
        """One status line: time so far and the evidence collected."""
        with self._lock:
            w = self.timeline.window_totals("all")
            ticks = int(w.ticks) if w else 0
        left = ""
        if self.opts.duration_s is not None:
            looked = self.looked(time.time() - elapsed)
            loop = "" if self.first_step_at is None or self.opts.attached else " of loop"
            left = f" ({looked:.0f} s{loop} of {self.opts.duration_s:.0f} s)"
            if self.first_step_at is None and not self.opts.attached and self.hooks_heard():
                left = f" (start-up: no step yet; the {self.opts.duration_s:.0f} s start at it)"
        return (
            f"profiling pid {self.target.pid}: {elapsed:.0f} s{left}, "
            f"{ticks} stack samples so far (Ctrl-C stops and writes the report)"
        )

    def stop(self) -> None:
        """Ask the session to end (from another thread)."""
        self._stop.set()

    def request_capture(self, steps: int = 10) -> str:
        """Ask the job's in-process hooks for a profiler capture of `steps` steps; a line
        saying what happens."""
        hooks = next((p for p in self.probes if p.captures), None)
        if hooks is None or not hooks.request_capture(steps):
            return "no capture: the job has no in-process hooks (gpudiag run, instrument())"
        return f"capture of {steps} steps asked for: it lands in the report"

    def pause(self, paused: bool) -> None:
        """While paused, samples are not collected (the job runs on untouched)."""
        self.paused = paused

    def snapshot(self, recent_s: float | None = None) -> Analysis:
        """An analysis of what was collected so far (for live views); with `recent_s`, of
        the last that many seconds of it only (a daemon's findings stay current)."""
        with self._lock:  # copied under the lock, analysed outside it: ingest goes on
            tl = self.timeline.snapshot()
        spans = tl.spans() if recent_s is not None else []
        return analyze(
            tl.window(spans[-1][1] - int(recent_s * 1e9), None)
            if recent_s is not None and spans
            else tl,
            self.settings.thresholds,
            self.settings.rules,
            self.settings.price,
            self.settings.price_table,
        )

    def _with_ranks(self, analysis: Analysis) -> tuple[Analysis, dict | None]:
        """A multi-rank job: the DIST findings added, and the report's rank sections."""
        if self.ranks is None:
            return analysis, None
        with self._lock:
            gpu = self.statuses.get("gpu")
            found, section = self.ranks.section(
                self.settings.thresholds, self.settings.rules, bool(gpu and gpu.available)
            )
        from gpudiag.analyzers.engine.finalize import with_more

        # the verdict rests on the main rank's samples; a DIST finding may lead it
        merged, verdict = with_more(
            list(analysis.findings),
            found,
            analysis.verdict,
            analysis.profile,
            analysis.metrics,
            self.settings.thresholds,
            analysis.compute or None,
        )
        return replace(analysis, findings=tuple(merged), verdict=verdict), section

    def result_so_far(self, recent_s: float | None = None) -> SessionResult:
        """What was collected so far, analysed (for live views; the session runs on); with
        `recent_s`, its last that many seconds only."""
        probes = [
            (p.live_status() if p.name in self.statuses else None)
            or self.statuses.get(p.name)
            or ProbeStatus(p.name, False, "starting")
            for p in self.probes
            if p.applies()
        ]
        analysis, dist = self._with_ranks(self.snapshot(recent_s))
        return SessionResult(
            analysis,
            probes,
            list(self.errors),
            self.start_time,
            time.time(),
            "stopped",
            self.exit_code,
            agent=self.governor.summary() if self.governor else None,
            distributed=dist,
        )

    def _why_unhooked(self) -> None:
        """Under run, when the job's hooks never reported: whether its Python could not load
        them (run isolated: -I/-E/-S, or a Triton stub's), for the hooks' status."""
        hooks = next((p for p in self.probes if isinstance(p, HookProbe)), None)
        stacks = next((p for p in self.probes if isinstance(p, StackProbe)), None)
        if hooks is None or hooks.optional or hooks.messages:
            return
        pid = (stacks.followed if stacks is not None else None) or self.target.pid
        args = self.popen.args if self.popen is not None else None
        hooks.blocked = hooks_blocked(pid, list(args) if isinstance(args, list) else None)

    def _close_probes(self, reason: str) -> None:
        """Close the session's probes (a hung one is left alone), join their threads, drain the
        buffered ones once more and take their final statuses and problems."""
        self.check_hung()
        self._why_unhooked()
        live = [p for p in self.probes if p.name not in self.hung]
        for probe in live:  # a hung probe's close() could hang too: left alone
            try:
                probe.close()
            except Exception as exc:
                self.error(probe.name, f"failed to close: {exc}")
        deadline = time.monotonic() + 20
        for th, name in self._threads:  # a hung probe's thread is left to the daemon exit
            if name not in self.hung:
                th.join(timeout=max(0.1, deadline - time.monotonic()))
        for probe in live:
            if (
                probe.buffered
                and self.statuses.get(probe.name, ProbeStatus(probe.name, False)).available
            ):
                try:
                    self._ingest(probe.sample())
                except Exception:
                    pass
            for msg in probe.problems():
                self.error(probe.name, msg)
            final = probe.final_status()
            if final is not None and probe.name in self.statuses:
                self.statuses[probe.name] = final
        stacks_ok = self.statuses.get("stacks")
        if stacks_ok is not None and stacks_ok.available and not self.timeline.window_totals("all"):
            self.error(
                "stacks",
                "py-spy returned no stack samples"
                + ("" if reason != "target_exited" else " before the job exited"),
            )

    def _final_result(self, start: float, reason: str) -> SessionResult:
        """The session's samples analysed (the ranks' findings added) into its result."""
        end = time.time()
        with self._lock:
            analysis = analyze(
                self.timeline,
                self.settings.thresholds,
                self.settings.rules,
                self.settings.price,
                self.settings.price_table,
            )
        analysis, dist = self._with_ranks(analysis)
        statuses = [
            self.statuses.get(p.name)
            or ProbeStatus(p.name, False, "not started (session ended first)")
            for p in self.probes
            if p.applies()
        ]
        hardware: dict = {}
        for p in self.probes:
            st = self.statuses.get(p.name)
            if st is not None and st.available:
                hardware.update(p.describe())
        agent = self.governor.summary() if self.governor is not None else None
        return SessionResult(
            analysis,
            statuses,
            self.errors,
            start,
            end,
            reason,
            self.exit_code,
            self.timeline,
            hardware,
            agent,
            dist,
        )

    def finish(self, start: float, reason: str) -> SessionResult:
        """Close probes (flushing partial windows), analyse, and return the result."""
        self._stop.set()
        if self.governor is not None:
            self.governor.stop()
        if self.ranks is not None:
            self.ranks.stop()
        old_int = None
        if self.stop_signals is None and threading.current_thread() is threading.main_thread():
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # finish the report
        try:
            self._close_probes(reason)
            return self._final_result(start, reason)
        finally:
            if old_int is not None:
                signal.signal(signal.SIGINT, old_int)


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `pid` is a descendant of `ancestor` (read from /proc, parent by parent)."""
    seen = 0
    while pid > 1 and seen < 64:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
        seen += 1
    return False
