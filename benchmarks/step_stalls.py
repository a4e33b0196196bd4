"""A public script's long steps ("stalls") beside what else the box ran: bare and under `run`.

Runs the script in arms one after another (`--arms`, e.g. bare run bare bare1: `bare` the
script alone, `run` under `gpudiag run --duration`, `bare1` alone with OMP_NUM_THREADS=1),
each `--seconds` of steps after its warm-up (tests/public/stepclock.py's step log), and
watches the box every 0.5 s: its busy cores (/proc/stat), the job's, and gpudiag's (the
`run` process and its children other than the job). Per arm: steps/s, the median step, the
steps over 2 s and their total, and the cores other processes (not the job, not gpudiag) and
gpudiag took during those steps and during the steps under 1 s. The 1-minute load before
and after each arm.

    python benchmarks/step_stalls.py trl_sft --arms bare run bare bare1 --seconds 60

Issue 57 (docs/evidence.md, TRL): the TRL job's steps of 0.4 s turn into 5-10 s steps
whenever the box's other processes take about a core, bare as under `run`: its two intra-op
threads meet at a barrier after every op, and a thread descheduled by another process holds
the other one up (OMP_NUM_THREADS=1 keeps the step near its own time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HZ = os.sysconf("SC_CLK_TCK")
TICK_S = 0.5
STALL_S = 2.0
FAST_S = 1.0


def load() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def busy_ticks() -> int:
    """The box's busy CPU ticks so far (all but idle and iowait)."""
    vals = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return sum(vals) - vals[3] - vals[4]


def procs() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, CPU ticks, command line) of every process."""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        out[int(p)] = (int(f[1]), int(f[11]) + int(f[12]), cmd)
    return out


def tree(table: dict[int, tuple[int, int, str]], root: int) -> set[int]:
    """`root` and its descendants."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in seen:
            seen.add(pid)
            todo.extend(kids.get(pid, []))
    return seen


class Watch:
    """Every TICK_S: [time, box cores, job cores, gpudiag cores]."""

    def __init__(self, launcher: int, script: str) -> None:
        self.launcher, self.script = launcher, script
        self.rows: list[list[float]] = []
        self.job_pid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _split(self) -> tuple[int, int]:
        table = procs()
        if self.job_pid is None or self.job_pid not in table:
            for pid, (_, _, cmd) in table.items():
                if cmd.startswith("python ") and self.script in cmd and "gpudiag" not in cmd:
                    self.job_pid = pid
        job = tree(table, self.job_pid) if self.job_pid else set()
        ours = tree(table, self.launcher) - job if self.launcher != self.job_pid else set()
        return sum(table[p][1] for p in job), sum(table[p][1] for p in ours)

    def _run(self) -> None:
        b0, (j0, g0) = busy_ticks(), self._split()
        while not self._stop.wait(TICK_S):
            b, (j, g) = busy_ticks(), self._split()
            cores = [max(0, x) / HZ / TICK_S for x in (b - b0, j - j0, g - g0)]
            self.rows.append([time.time(), *cores])
            b0, j0, g0 = b, j, g

    def stop(self) -> list[list[float]]:
        self._stop.set()
        self._thread.join()
        return self.rows


def run_arm(arm: str, script: str, seconds: float, duration: float, tmp: str) -> dict:
    """One arm: the job's step times and the box beside them."""
    steps_path = os.path.join(tmp, f"steps-{arm}-{time.time():.0f}.json")
    env = {**os.environ, "PUBLIC_SECONDS": str(seconds), "PUBLIC_STEP_LOG": steps_path}
    job = ["python", f"tests/public/{script}/main.py"]
    if arm == "bare1":
        env["OMP_NUM_THREADS"] = "1"
    if arm == "run":
        out = os.path.join(tmp, "run.json")
        job = ["gpudiag", "run", "--duration", str(duration), "--out", out, "--", *job]
    before = load()
    proc = subprocess.Popen(
        job, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    watch = Watch(proc.pid, f"tests/public/{script}/main.py")
    proc.wait(timeout=seconds * 10 + 300)
    while watch.job_pid is not None and Path(f"/proc/{watch.job_pid}").exists():
        time.sleep(0.5)  # under `run`, the job outlives gpudiag
    rows = watch.stop()
    times = json.loads(Path(steps_path).read_text())[3:]
    return summary(arm, times, rows, before, load())


def summary(
    arm: str, times: list[float], rows: list[list[float]], before: float, after: float
) -> dict:
    """The arm's figures (module docstring)."""
    steps = list(zip(times, times[1:], strict=False))

    def mean_over(kind: list[tuple[float, float]], col: int) -> float | None:
        vals = []
        for a, b in kind:
            window = [r for r in rows if a < r[0] < b + TICK_S]  # a row covers the TICK_S before it
            if window:
                if col == 0:  # others: the box less the job and gpudiag
                    vals.append(statistics.mean(r[1] - r[2] - r[3] for r in window))
                else:
                    vals.append(statistics.mean(r[col] for r in window))
        return round(statistics.mean(vals), 2) if vals else None

    stalls = [(a, b) for a, b in steps if b - a > STALL_S]
    fast = [(a, b) for a, b in steps if b - a <= FAST_S]
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "arm": arm,
        "steps": len(steps),
        "steps_per_s": round(len(steps) / span, 3) if span else None,
        "median_step_s": round(statistics.median(b - a for a, b in steps), 3) if steps else None,
        "stalls": len(stalls),
        "stall_s": round(sum(b - a for a, b in stalls), 1),
        "others_cores_in_stalls": mean_over(stalls, 0),
        "others_cores_in_fast": mean_over(fast, 0),
        "gpudiag_cores_in_stalls": mean_over(stalls, 3),
        "gpudiag_cores_in_fast": mean_over(fast, 3),
        "load": [before, after],
        "step_s": [round(b - a, 2) for a, b in steps],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("script", help="a tests/public/ folder, e.g. trl_sft")
    ap.add_argument("--arms", nargs="+", default=["bare", "run", "bare"])
    ap.add_argument("--seconds", type=float, default=60.0, help="training seconds an arm")
    ap.add_argument("--duration", type=float, default=30.0, help="run's --duration")
    ap.add_argument("--json", action="store_true", help="one JSON line per arm")
    args = ap.parse_args()
    bad = [a for a in args.arms if a not in ("bare", "run", "bare1")]
    if bad or not (ROOT / "tests/public" / args.script / "main.py").is_file():
        print(f"step_stalls: unknown arm or script: {bad or args.script}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for arm in args.arms:
            res = run_arm(arm, args.script, args.seconds, args.duration, tmp)
            if args.json:
                print(json.dumps(res), flush=True)
                continue
            line = {k: v for k, v in res.items() if k != "step_s"}
            print(" ".join(f"{k}={v}" for k, v in line.items()), flush=True)
            print("  steps:", res["step_s"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
