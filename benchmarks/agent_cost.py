"""What gpudiag costs: its CPU and memory attached to a light job, and the job's throughput.

1. CPU: for each worker count (default 0, 4, 16) start benchmarks/light_job.py (a small MLP,
   a DataLoader whose __getitem__ sleeps 2 ms), let it warm up, then run
   `gpudiag attach PID --duration SECONDS` and read the whole gpudiag process's CPU time
   (its threads and every py-spy it ran and waited for, from wait4's rusage, start-up and
   report writing included) and its peak RSS; the report's `run.agent` gives what the
   governor measured while sampling and the rates it used.
2. Throughput: with 8 workers, rounds of the job alone and the job with gpudiag attached,
   interleaved (the order alternates each round); steps/s counted after a warm-up; the ratio
   per round and the median.

    python benchmarks/agent_cost.py --seconds 60 --workers 0 4 16 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = Path(__file__).resolve().parent / "light_job.py"
GPUDIAG = [sys.executable, "-m", "gpudiag.agent.cli.main"]


def _start_job(workers: int, seconds: float, warmup: float) -> subprocess.Popen:
    job = subprocess.Popen(
        [
            sys.executable,
            str(JOB),
            "--workers",
            str(workers),
            "--seconds",
            str(seconds),
            "--warmup",
            str(warmup),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert job.stdout is not None
    if job.stdout.readline().strip() != "ready":
        raise SystemExit("the light job did not start")
    return job


def _steps_per_s(job: subprocess.Popen) -> float:
    out = job.communicate(timeout=600)[0]
    m = re.search(r"steps: (\d+) in ([\d.]+) s", out)
    if not m:
        raise SystemExit(f"no step count from the job: {out!r}")
    return int(m.group(1)) / float(m.group(2))


def _attach(pid: int, seconds: float, out: str, extra: list[str]) -> dict:
    """Run gpudiag attach; its CPU (self + waited-for children) and peak RSS, and its report."""
    t0 = time.monotonic()
    p = subprocess.Popen(
        [*GPUDIAG, "attach", str(pid), "-q", "--duration", str(seconds), "--out", out, *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"gpudiag attach failed: {p.stderr.read().decode() if p.stderr else ''}")
    doc = json.loads(Path(out).read_text())
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "gpudiag_maxrss_mb": usage.ru_maxrss / 1024,
        "report": doc,
    }


def cpu_cost(workers: list[int], seconds: float, extra: list[str]) -> None:
    """Part 1: the agent's CPU and memory per worker count."""
    print(f"## gpudiag CPU over a {seconds:.0f} s attach (whole process, start-up included)")
    with tempfile.TemporaryDirectory() as tmp:
        for w in workers:
            job = _start_job(w, seconds + 60, 0)
            try:
                time.sleep(8)  # past start-up: the job is training
                r = _attach(job.pid, seconds, f"{tmp}/w{w}.json", extra)
            finally:
                job.kill()
                job.wait()
            agent = r["report"]["run"].get("agent") or {}
            rates = {k: v["mean"] for k, v in (agent.get("rates") or {}).items()}
            peak = agent.get("peak_rss_bytes") or 0
            findings = [f["id"] for f in r["report"]["findings"]]
            print(
                f"workers={w:<3} cpu {r['cpu_s']:.2f} s in {r['wall_s']:.1f} s = "
                f"{100 * r['cpu_s'] / r['wall_s']:.2f}% of a core "
                f"(while sampling, governor: {100 * (agent.get('cpu_cores') or 0):.2f}%, "
                f"py-spy {100 * (agent.get('py_spy_cpu_cores') or 0):.2f}%); "
                f"peak RSS gpudiag {r['gpudiag_maxrss_mb']:.0f} MB, with py-spy "
                f"{peak / 2**20:.0f} MB; loop samples {r['report']['breakdown']['samples']}; "
                f"findings {findings}",
                flush=True,
            )
            print(f"             mean rates: {json.dumps(rates)}", flush=True)


def throughput(workers: int, rounds: int, seconds: float, extra: list[str]) -> None:
    """Part 2: the job's steps/s alone and with gpudiag attached, interleaved rounds."""
    print(f"## throughput with {workers} workers: {rounds} interleaved rounds of {seconds:.0f} s")
    warmup = 8.0
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            res = {}
            for mode in ("bare", "gpudiag") if r % 2 == 0 else ("gpudiag", "bare"):
                job = _start_job(workers, seconds, warmup)
                agent = None
                if mode == "gpudiag":
                    time.sleep(3)
                    agent = subprocess.Popen(
                        [
                            *GPUDIAG,
                            "attach",
                            str(job.pid),
                            "-q",
                            "--duration",
                            str(seconds + warmup),
                            "--out",
                            f"{tmp}/r{r}.json",
                            *extra,
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                res[mode] = _steps_per_s(job)
                if agent is not None:
                    agent.wait(timeout=120)
            ratios.append(res["gpudiag"] / res["bare"])
            print(
                f"round {r + 1}: bare {res['bare']:.1f} steps/s, with gpudiag "
                f"{res['gpudiag']:.1f} steps/s, ratio {ratios[-1]:.3f}",
                flush=True,
            )
    print(
        f"median ratio {statistics.median(ratios):.3f} "
        f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})"
    )


def main() -> None:
    """Run both parts."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--workers", type=int, nargs="*", default=[0, 4, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--throughput-workers", type=int, default=8)
    ap.add_argument("--throughput-seconds", type=float, default=30.0)
    ap.add_argument("--skip-cpu", action="store_true")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--gpudiag-args", default="", help="extra options for gpudiag attach")
    args = ap.parse_args()
    extra = args.gpudiag_args.split()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    if not args.skip_cpu:
        cpu_cost(args.workers, args.seconds, extra)
    if not args.skip_throughput and args.rounds > 0:
        throughput(args.throughput_workers, args.rounds, args.throughput_seconds, extra)


if __name__ == "__main__":
    main()
