"""`gpudiag demo`: profile a built-in job with a planted input-pipeline bottleneck."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys

from gpudiag.agent.config import load_settings
from gpudiag.agent.errors import UsageError
from gpudiag.agent.render import render_text
from gpudiag.agent.report import check_writable, report_of, write_report
from gpudiag.agent.session import Session, SessionOptions
from gpudiag.probes.base import Target


def cmd_demo(args: argparse.Namespace) -> int:
    """Launch the demo job, profile it for --duration seconds, print the full diagnosis."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            "the demo needs PyTorch in this environment: "
            "pip install 'gpudiag[demo]' (a CPU build of torch is enough)"
        )
    out = args.out or "gpudiag-demo.json"
    check_writable(out)
    settings = load_settings(None, None)
    cmd = [sys.executable, "-m", "gpudiag.agent.demo_job", "--seconds", str(args.duration + 60)]
    print(
        "gpudiag demo: training a small CNN whose DataLoader has num_workers=0 and a slow "
        f"augmentation; profiling it for {args.duration:.0f} s...",
        file=sys.stderr,
    )
    popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    session = Session(
        Target(popen.pid), settings, SessionOptions(duration_s=args.duration), popen=popen
    )
    try:
        result = session.run()
    finally:
        if popen.poll() is None:
            popen.terminate()
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                popen.kill()
    # the demo job is stopped by gpudiag, so its exit code is not the job's own
    doc = report_of(
        dataclasses.replace(result, exit_code=None),
        mode="demo",
        command=cmd,
        pid=popen.pid,
        settings=settings,
    )
    path = write_report(doc, out)
    print(render_text(doc))
    print(f"\nReport written to {path}")
    return 0 if result.end_reason != "interrupted" else 130
