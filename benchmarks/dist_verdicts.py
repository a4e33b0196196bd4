"""Are the distributed verdicts stable? Each planted DDP rank problem of
tests/workloads/dist_ddp.py (two gloo ranks under torchrun on the CPU) run N times under
`gpudiag run` and N times with `gpudiag attach` to rank 1, and the answers counted:

- loop: rank 1 slow in its own loop work (outside forward/backward/optimizer);
- data: rank 1 slow in its own DataLoader;
- backward: rank 1 slow in its own backward;
- hang (run only): rank 1 stops calling backward; DIST002 must name it while the job is hung,
  with the seconds from the last step to the report.

An answer is the straggler rank and the cause's keyword ("undecided" when the report abstains,
"none" for no straggler); for a hang, whether DIST002 named rank 1 and how long it took.

    python benchmarks/dist_verdicts.py --runs 10 --plants loop data backward hang --modes run attach
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "workloads" / "dist_ddp.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
JOB = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(WORKLOAD)]
SAMPLING = ["--cpu-budget", "0", "--rate", "50", "--window", "2"]
GPUDIAG = [sys.executable, "-m", "gpudiag.agent.cli.main"]
CAUSES = {
    "own loop work": "loop",
    "DataLoader": "data",
    "own compute": "compute",
    "throttled": "gpu",
}


def kill_tree(pid: int) -> None:
    """The launcher and every process below it (a hung rank may have left its group)."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def answer(doc: dict) -> str:
    """The straggler verdict in one word: rank:cause, none or undecided."""
    dec = (doc.get("distributed") or {}).get("straggler") or {}
    if not dec.get("decided"):
        return "undecided"
    if dec.get("straggler") is None:
        return "none"
    f = next((f for f in doc["findings"] if f["id"] == "DIST001"), None)
    cause = next((v for k, v in CAUSES.items() if f and k in f["message"]), "other")
    basis = "measured" if "measured" in (dec.get("basis") or "") else "inferred"
    return f"rank{dec['straggler']}:{cause}:{basis}"


def run_mode(plant: str, seconds: float, tmp: Path) -> str:
    out = tmp / "r.json"
    env = {**os.environ, "GPUDIAG_TEST_PLANT": plant}
    cmd = [*GPUDIAG, "run", *SAMPLING, "--out", str(out), "--", *JOB, "--seconds", str(seconds)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)  # fmt: skip
    try:
        _, err = p.communicate(timeout=seconds + 150)
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        kill_tree(p.pid)
    if p.returncode != 0 or not out.exists():
        (tmp / "stderr.txt").write_bytes(err)  # the whole of it, kept with --keep
        return f"error rc={p.returncode}: {err.decode()[-200:]!r}"
    return answer(json.loads(out.read_text()))


def attach_mode(plant: str, seconds: float, tmp: Path) -> str:
    from gpudiag.probes.dist.ranks import find_ranks

    env = {**os.environ, "GPUDIAG_TEST_PLANT": plant}
    job = subprocess.Popen([*JOB, "--seconds", str(seconds + 30)], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)  # fmt: skip
    try:
        ranks: list = []
        deadline = time.monotonic() + 60
        while len(ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            ranks = find_ranks(job.pid)
        if len(ranks) < 2:
            return "ranks not found"
        time.sleep(3)  # past the imports
        out = tmp / "a.json"
        pid = next(r.pid for r in ranks if r.rank == 1)
        cmd = [
            *GPUDIAG,
            "attach",
            str(pid),
            *SAMPLING,
            "--duration",
            str(seconds),
            "--out",
            str(out),
        ]
        res = subprocess.run(cmd, capture_output=True, timeout=seconds + 150)
        if res.returncode != 0 or not out.exists():
            return f"error rc={res.returncode}: {res.stderr.decode()[-200:]!r}"
        return answer(json.loads(out.read_text()))
    finally:
        kill_tree(job.pid)
        job.wait()


def why_not(p: subprocess.Popen, out: Path) -> str:
    """Ctrl-C to gpudiag for its final report: the ranks it followed and its notes."""
    if p.poll() is not None:
        return f" (gpudiag exited rc={p.returncode})"
    p.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=60)
    if not out.exists():
        return " (no final report either)"
    doc = json.loads(out.read_text())
    notes = (doc.get("distributed") or {}).get("notes") or []
    return f" (final report: {len(doc.get('ranks') or [])} ranks; notes: {notes[-2:]})"


def hang_mode(hang_s: float, tmp: Path) -> str:
    """DIST002 while hung: whether it names rank 1, and the seconds from start to report."""
    out = tmp / "h.json"
    env = {**os.environ, "GPUDIAG_TEST_PLANT": "hang"}
    opts = [*SAMPLING, "--set", f"dist_hang_s={hang_s:g}", "--out", str(out)]
    cmd = [*GPUDIAG, "run", *opts, "--", *JOB, "--seconds", "300"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 150
        while not out.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.25)
        if not out.exists():
            return "no report while hung" + why_not(p, out)
        time.sleep(0.5)
        doc = json.loads(out.read_text())
    finally:
        kill_tree(p.pid)
        p.wait()
    f = next((f for f in doc["findings"] if f["id"] == "DIST002"), None)
    if f is None:
        return "no DIST002"
    quiet = doc["distributed"]["hang"]["seconds_without_step"]
    named = "rank 1 is not in it" in f["message"] and "DDP's gradient all-reduce" in f["message"]
    within = "within" if quiet <= hang_s + 2 else "later than"
    return f"{'named rank1' if named else 'not named'}, {within} dist_hang_s+2 s"


def keep(tmp: Path, into: Path, name: str) -> None:
    """The run's report(s) kept for a look at an odd answer."""
    into.mkdir(parents=True, exist_ok=True)
    for f in ("r.json", "a.json", "h.json", "stderr.txt"):
        if (tmp / f).exists():
            (tmp / f).rename(into / f"{name}-{f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10.0, help="each job's (or attach's) length")
    ap.add_argument("--plants", nargs="+", default=["loop", "data", "backward", "hang"])
    ap.add_argument("--modes", nargs="+", default=["run", "attach"])
    ap.add_argument("--hang-s", type=float, default=4.0, help="dist_hang_s for the hang runs")
    ap.add_argument("--json", help="write the counts here")
    ap.add_argument("--keep", help="copy every run's report into this folder")
    args = ap.parse_args()
    counts: dict[str, Counter] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for plant in args.plants:
            for mode in args.modes:
                if plant == "hang" and mode != "run":
                    continue
                key = f"{plant}/{mode}"
                counts[key] = Counter()
                for i in range(args.runs):
                    if plant == "hang":
                        got = hang_mode(args.hang_s, tmp)
                    elif mode == "run":
                        got = run_mode(plant, args.seconds, tmp)
                    else:
                        got = attach_mode(plant, args.seconds, tmp)
                    counts[key][got] += 1
                    print(f"{key} #{i + 1}: {got}", flush=True)
                    if args.keep:
                        keep(tmp, Path(args.keep), f"{plant}-{mode}-{i + 1}")
    print()
    for key, c in counts.items():
        print(f"{key:16} " + ", ".join(f"{n}x {a}" for a, n in c.most_common()))
    if args.json:
        Path(args.json).write_text(json.dumps({k: dict(v) for k, v in counts.items()}, indent=1))


if __name__ == "__main__":
    main()
