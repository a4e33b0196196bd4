"""Issue 55, plain attach: does `gpudiag attach PID` (py-spy stacks only, no hooks) name the
planted module's call site at the top of its compute_stacks split? One look a job, one job at
a time, all under one hold of the box-wide measurement lock; prints the job, the load average,
the split's top rows (share of the loop, label) and the verdict's sureness.

    python benchmarks/compute_stacks_looks.py [--jobs lm_head over_wide ...] [--seconds 15]

A job is a cause of tests/workloads/compute_open_world.py, or broadcast_matmul.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "tests" / "workloads"
JOBS = ["lm_head", "over_wide", "dense_embed", "sample_loop", "const_encode", "healthy"]
JOBS += ["transformer", "broadcast_matmul"]


def job_argv(job: str, seconds: int) -> list[str]:
    if job == "broadcast_matmul":
        return [sys.executable, str(WORKLOADS / "broadcast_matmul.py"), "--seconds", str(seconds)]
    script = str(WORKLOADS / "compute_open_world.py")
    return [sys.executable, script, job, "--seconds", str(seconds)]


def look(job: str, seconds: int, tmp: Path) -> dict:
    """Start the job, wait for its first step, attach plainly for `seconds`; the report."""
    ready, out = tmp / f"{job}.ready", tmp / f"{job}.json"
    env = {**os.environ, "GPUDIAG_TEST_READY": str(ready)}
    proc = subprocess.Popen(job_argv(job, seconds + 90), env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        cmd = [sys.executable, "-m", "gpudiag.agent.cli.main", "attach", str(proc.pid), "-q"]
        cmd += ["--duration", str(seconds), "--out", str(out)]
        subprocess.run(cmd, timeout=seconds + 120, check=False, stdout=subprocess.DEVNULL)
    finally:
        proc.kill()
        proc.wait()
    return json.loads(out.read_text()) if out.exists() else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="*", default=JOBS)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--lock", default="/work/measure.lock")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, open(args.lock, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # all the looks in one hold (about 45 s a job)
        for job in args.jobs:
            load = open("/proc/loadavg").read().split()[0]
            doc = look(job, args.seconds, Path(d))
            after = open("/proc/loadavg").read().split()[0]
            cs = doc.get("compute_stacks") or {}
            v = doc.get("verdict") or {}
            print(
                f"## {job} (load {load}-{after}; {cs.get('loop_samples', 0):.0f} samples; "
                f"verdict {v.get('finding')} sure={v.get('sure')})",
                flush=True,
            )
            for r in (cs.get("rows") or [])[: args.rows]:
                print(f"  {r['share']:6.1%}  {r['label']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
