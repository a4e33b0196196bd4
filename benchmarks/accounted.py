"""Looks at jobs whose time no older catalogue entry explained (issue 39): each job under
`gpudiag run` and `gpudiag attach` (--until-sure, at most 30 s), N looks per mode, printing the
warnings, whether the verdict was sure, its samples and the box's load; then, with --fixes,
each job bare and with its fix over interleaved rounds (steps in 12 s, from the job's own
`steps: N in S s` line).

    python benchmarks/accounted.py [--looks 2] [--fixes] [--job NAME=CMD...|FIX_CMD ...]

Built in: the planted metrics POST, the planted healthy job and nanoGPT evaluating every 10
iterations. Held-out jobs kept outside the repository are added with --job (the command, then
`|` and the fixed command). Run it alone on the box: every figure is a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
GPUDIAG = [PY, "-m", "gpudiag.agent.cli.main"]
W = ROOT / "tests" / "workloads"
NANO = ROOT / "tests" / "public" / "nanogpt" / "train.py"
JOBS: dict[str, tuple[list[str], list[str] | None]] = {
    "metrics_post": (
        [PY, str(W / "metrics_post.py"), "--seconds", "80"],
        [PY, str(W / "metrics_post.py"), "--seconds", "80", "--post-every", "50"],
    ),
    "nanogpt_eval10": (
        [PY, str(NANO), "--eval_interval", "10", "--no-checkpoint"],
        [PY, str(NANO), "--eval_interval", "250", "--no-checkpoint"],
    ),
    "healthy": ([PY, str(W / "healthy.py"), "--seconds", "80"], None),
}
ENV = {**os.environ, "PUBLIC_SECONDS": "80"}


def summary(out: Path) -> str:
    """The warnings, the verdict's sureness and its samples, from a report."""
    try:
        d = json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        return f"no report ({exc})"
    top = [f"{f['id']}:{f['impact']:.2f}" for f in d["findings"] if f["severity"] != "note"]
    v = d.get("verdict") or {}
    return f"{top[:3] or 'none'} sure={v.get('sure')} samples={d['breakdown'].get('samples')}"


def end_jobs(cmd: list[str]) -> None:
    """End the job a `run --duration` left running: processes whose command line is `cmd`
    (never this benchmark, whose own command line may name the job)."""
    import psutil

    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["pid"] != os.getpid() and p.info["cmdline"] == cmd:
            p.kill()


def look(name: str, mode: str, i: int, tmp: Path) -> str:
    """One look; its line."""
    cmd, out, load = JOBS[name][0], tmp / f"{name}.{mode}.{i}.json", os.getloadavg()[0]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    args = ["-q", "--until-sure", "--duration", "30", "--out", str(out)]
    if mode == "run":
        subprocess.run([*GPUDIAG, "run", *args, "--", *cmd], env=ENV, timeout=240, **quiet)
        end_jobs(cmd)
    else:
        job = subprocess.Popen(cmd, env=ENV, **quiet)
        time.sleep(8)
        subprocess.run([*GPUDIAG, "attach", str(job.pid), *args], timeout=240, **quiet)
        job.kill()
        job.wait()
    return f"{name:16s} {mode:6s} #{i}  load {load:.1f}  {summary(out)}"


def steps(cmd: list[str]) -> str:
    """The job's steps in 12 s."""
    env = {**ENV, "PUBLIC_SECONDS": "12"}
    cmd = [c if c != "80" else "12" for c in cmd]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    m = re.findall(r"^steps: .*$", res.stdout, flags=re.M)
    return m[-1] if m else f"no steps line (exit {res.returncode})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--looks", type=int, default=2)
    ap.add_argument("--fixes", action="store_true", help="also time each job bare and fixed")
    ap.add_argument("--job", action="append", default=[], metavar="NAME=CMD|FIX_CMD")
    ap.add_argument("--only", nargs="*", help="these jobs only")
    a = ap.parse_args(argv)
    for spec in a.job:
        name, _, cmds = spec.partition("=")
        bare, _, fixed = cmds.partition("|")
        JOBS[name] = (shlex.split(bare), shlex.split(fixed) if fixed.strip() else None)
    names = a.only or list(JOBS)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpudiag-accounted-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    for name in names:
        for mode in ("run", "attach"):
            for i in range(1, a.looks + 1):
                print(look(name, mode, i, tmp), flush=True)
    if a.fixes:
        for _ in range(2):
            for name in names:
                bare, fixed = JOBS[name]
                if fixed:
                    print(f"{name} bare: {steps(bare)} | fixed: {steps(fixed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
