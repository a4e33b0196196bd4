"""`gpudiag demo`: profile a built-in job with a planted input-pipeline bottleneck.

The job is launched as `run` launches one (the in-process hooks time every step); the clock
starts at its first step, not at its start-up (torch's import alone takes seconds on a busy
box); profiling stops once the verdict is sure (the same cause, with high confidence, in
several checks in a row), or at `--duration` seconds of loop; the last line says what it
found."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.options import FromArgs, positive
from gpudiag.agent.output.render.formats import as_report
from gpudiag.agent.output.render.text import render_text
from gpudiag.agent.output.report import check_writable, report_of, write_report
from gpudiag.agent.session.launch import launch
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
from gpudiag.text.formatting import speedup_text
from gpudiag.text.sink import emit

if TYPE_CHECKING:
    from gpudiag.analyzers import Analysis

FIRST_STEP_WAIT_S = 180.0  # start-up allowed before the first step (imports on a busy box)
CHECK_EVERY_S = 2.0  # how often the verdict so far is looked at
MIN_LOOP_S = 6.0  # loop time before a verdict may count as sure
SURE_CONFIDENCE = 0.95  # a finding this confident (and error/warning) may end the demo...
SURE_CHECKS = 3  # ...once it led this many checks in a row
CAUSES = {  # what a finding id means in the demo's last line
    "DATA001": "loader-bound",
    "DATA002": "loader-bound",
    "IO001": "storage-bound",
    "HOST001": "host-bound",
    "GIL001": "GIL-bound",
    "CKPT001": "checkpoint-bound",
}


@dataclasses.dataclass
class DemoClock:
    """When the loop started, why profiling stopped, and the sure finding (if any)."""

    loop_start: float | None = None
    reason: str = ""
    sure: str | None = None


def sure_cause(analysis: Analysis) -> str | None:
    """The id of the leading finding when it is sure enough to end the demo."""
    for f in analysis.findings:
        if f.severity in ("error", "warning"):
            return f.id if f.confidence >= SURE_CONFIDENCE else None
    return None


def watch_verdict(
    session: Session, first_step: threading.Event, done: threading.Event, cap_s: float
) -> DemoClock:
    """Stop `session` once its verdict is sure, or `cap_s` after the first step (a thread)."""
    clock = DemoClock()

    def loop() -> None:
        if not first_step.wait(FIRST_STEP_WAIT_S) or done.is_set():
            clock.reason = "" if done.is_set() else f"no training step in {FIRST_STEP_WAIT_S:g} s"
            session.stop()
            return
        clock.loop_start = time.monotonic()
        streak, last = 0, None
        while not done.wait(CHECK_EVERY_S):
            loop_s = time.monotonic() - clock.loop_start
            if loop_s >= cap_s:
                clock.reason = f"--duration {cap_s:g} s of loop reached"
                break
            if loop_s < MIN_LOOP_S:
                continue
            cause = sure_cause(session.snapshot())
            streak = streak + 1 if cause is not None and cause == last else int(cause is not None)
            last = cause
            if streak >= SURE_CHECKS:
                clock.reason, clock.sure = f"sure after {loop_s:.0f} s of loop", cause
                break
        session.stop()

    threading.Thread(target=loop, daemon=True, name="gpudiag-demo-verdict").start()
    return clock


def found_line(doc: dict, clock: DemoClock) -> str:
    """One line: the planted cause the demo found, or why it found none."""
    top = next((f for f in doc["findings"] if f["severity"] in ("error", "warning")), None)
    why = f" ({clock.reason})" if clock.reason else ""
    if top is None:
        return f"Found: no sure cause{why}; see the report above."
    cause = CAUSES.get(top["id"], top["title"])
    return (
        f"Found: {cause}: {top['id']} {top['title']}, {top['impact']:.0%} of the loop, "
        f"{speedup_text(top)}, confidence {top['confidence']:.0%}{why}."
    )


@dataclasses.dataclass(frozen=True)
class DemoOptions(FromArgs):
    """`gpudiag demo`'s options."""

    duration: float = 60.0  # the most loop time to profile
    out: str | None = None


def main(args: DemoOptions) -> int:
    """Launch the demo job, profile its loop until the verdict is sure (at most --duration
    seconds of loop), print the full diagnosis and one line with what it found."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            "the demo needs PyTorch in this environment: "
            "pip install 'gpudiag[demo]' (a CPU build of torch is enough)"
        )
    out = args.out or "gpudiag-demo.json"
    check_writable(out)
    settings = load_settings(None, None)
    seconds = FIRST_STEP_WAIT_S + args.duration + 60
    cmd = [sys.executable, "-m", "gpudiag.agent.commands.demo_job", "--seconds", f"{seconds:g}"]
    emit(
        "gpudiag demo: training a small CNN whose DataLoader has num_workers=0 and a slow "
        f"augmentation; profiling its loop (from the first step) until the verdict is sure, "
        f"at most {args.duration:.0f} s...",
        file=sys.stderr,
    )
    job = launch(cmd, inject=True, stdout=subprocess.DEVNULL)
    first_step, done = threading.Event(), threading.Event()

    def sink(samples: Iterable[Any]) -> None:
        if any(s.probe == "hooks" and s.labels.get("kind") == "step" for s in samples):
            first_step.set()

    opts = SessionOptions(duration_s=None, progress=False)
    session = job.session(settings, opts, parts=SessionParts(sink=sink))
    clock = watch_verdict(session, first_step, done, args.duration)
    try:
        result = session.run()
    finally:
        done.set()
        first_step.set()
        if job.popen.poll() is None:
            job.popen.terminate()
            try:
                job.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                job.popen.kill()
    # the demo job is stopped by gpudiag, so its exit code is not the job's own
    doc = report_of(
        dataclasses.replace(result, exit_code=None),
        mode="demo",
        command=cmd,
        pid=job.popen.pid,
        settings=settings,
    )
    path = write_report(doc, out)
    emit(render_text(as_report(doc)))
    emit(f"\nReport written to {path}")
    emit(found_line(doc, clock))
    return 0 if result.end_reason != "interrupted" else 130


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `demo` subcommand."""
    p = sub.add_parser(
        "demo",
        help="profile a built-in training job with a planted bottleneck",
        description="Run a small PyTorch training job whose input pipeline is "
        "starved (num_workers=0, CPU-heavy transform), profile it "
        "and show the diagnosis. Needs PyTorch; no GPU needed.",
    )
    p.add_argument(
        "--duration",
        type=positive,
        default=60.0,
        metavar="SECONDS",
        help="the most loop time to profile: it stops as soon as the verdict is sure; the "
        "clock starts at the job's first step (default: 60)",
    )
    p.add_argument("--out", metavar="FILE", help="report file (default: ./gpudiag-demo.json)")
