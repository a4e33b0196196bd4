"""What `gpudiag watch` costs with 1, 4 and 16 watched jobs: its CPU and memory.

For each job count, start that many copies of benchmarks/light_job.py (a small MLP whose
loading sleeps; CPU jobs with PyTorch loaded, so watch discovers them as it would on a GPU
box), run `gpudiag watch --duration SECONDS --match <their folder>` at its default budget
(10% of one core, 400 MB, for all jobs together), scrape its /metrics every 15 s as
Prometheus would, and read:

- CPU: gpudiag's process and every py-spy it ran, in cores: over the whole run (discovery
  and start-up included) and over the steady part after `--settle` seconds;
- memory: the peak of gpudiag's resident memory plus that of its live py-spy recorders;
- the jobs it showed on /metrics at the end, and the governors' own measure per job.

    python benchmarks/watch_cost.py --jobs 1 4 16 --seconds 90
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

JOB = Path(__file__).resolve().parent / "light_job.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(p: psutil.Process) -> float:
    """CPU seconds of a process, its reaped children, and its live children now."""
    t = p.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for c in p.children(recursive=True):
        try:
            ct = c.cpu_times()
            total += ct.user + ct.system
        except psutil.Error:
            pass
    return total


def _rss(p: psutil.Process) -> int:
    total = p.memory_info().rss
    for c in p.children(recursive=True):
        try:
            total += c.memory_info().rss
        except psutil.Error:
            pass
    return total


def _scrape(url: str) -> dict[str, list]:
    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _start_jobs(folder: Path, n: int, seconds: float) -> list[subprocess.Popen]:
    """`n` light jobs of `seconds`, each from a copy of the job script in `folder` (what
    watch --match picks)."""
    script = folder / "watched_job.py"
    shutil.copy(JOB, script)
    return [
        subprocess.Popen(
            [sys.executable, str(script), "--seconds", str(seconds)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def _shown(fams: dict[str, list]) -> tuple[int, list[float]]:
    """From the last scrape: how many jobs the endpoint showed, and the governor's CPU cores
    per job."""
    # the pid is only in gpudiag_job_info (issue 53 N23: one series per job, joined on `job`)
    shown = {s.labels.get("pid") for s in fams.get("gpudiag_job_info", [])}
    return len(shown), [s.value for s in fams.get("gpudiag_agent_cpu_cores", [])]


def measure(n: int, seconds: float, settle: float, extra: list[str]) -> dict:
    """Run watch over `n` light jobs; its cost."""
    folder = Path(tempfile.mkdtemp(prefix="gpudiag-watch-bench-"))
    jobs = _start_jobs(folder, n, seconds + 120)
    time.sleep(5 + n * 0.5)  # past their imports: PyTorch loaded
    port = _port()
    cmd = [sys.executable, "-m", "gpudiag.agent.cli.main", "watch", "--metrics-port", str(port)]
    cmd += ["--match", str(folder), "--duration", str(seconds), "-q", *extra]
    watch = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(watch.pid)
    url = f"http://127.0.0.1:{port}/metrics"
    t0 = time.monotonic()
    peak, cpu_settled, t_settled, last, fams, own = 0, None, None, None, {}, 0.0
    next_scrape = t0 + 15
    try:
        while True:  # reaped here (not by Popen.poll) to read its rusage
            pid, status, usage = os.wait4(watch.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(1)
            now = time.monotonic()
            try:
                peak = max(peak, _rss(proc))
                cpu = _cpu_s(proc)
            except psutil.Error:
                continue
            if cpu_settled is None and now - t0 >= settle:
                cpu_settled, t_settled = cpu, now
            last = (cpu, now)
            try:
                own = sum(proc.cpu_times()[:2])
            except psutil.Error:
                pass
            if now >= next_scrape and now - t0 < seconds - 2:
                next_scrape += 15
                try:
                    fams = _scrape(url)
                except OSError:
                    pass
        watch.returncode = os.waitstatus_to_exitcode(status)
        total_cpu = usage.ru_utime + usage.ru_stime
        wall = time.monotonic() - t0
    finally:
        for j in jobs:
            j.kill()
            j.wait()
        shutil.rmtree(folder, ignore_errors=True)
    shown, per_job = _shown(fams)
    steady = None
    if cpu_settled is not None and last is not None and last[1] > t_settled:
        steady = (last[0] - cpu_settled) / (last[1] - t_settled)
    return {
        "jobs": n,
        "jobs_shown": shown,
        "seconds": round(wall, 1),
        "cpu_cores_whole_run": round(total_cpu / wall, 4),
        "cpu_cores_steady": None if steady is None else round(steady, 4),
        "py_spy_share": round(1 - own / total_cpu, 3) if total_cpu else None,
        "peak_rss_mb": round(peak / 2**20, 1),
        "governor_cpu_cores_per_job_mean": (
            round(sum(per_job) / len(per_job), 4) if per_job else None
        ),
        "exit_status": os.waitstatus_to_exitcode(status),
        # each job's share of the time its stacks were recorded at the last scrape (1: never
        # paced; docs/fleet.md "One job's share")
        "stacks_sampled_ratio": sorted(
            round(x.value, 3) for x in fams.get("gpudiag_stacks_sampled_ratio", [])
        ),
    }


def main() -> None:
    """Measure each job count and print a table (and JSON with --json)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--seconds", type=float, default=90.0, help="watch this long per job count")
    ap.add_argument("--settle", type=float, default=30.0, help="seconds before 'steady'")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("watch_args", nargs="*", help="more `gpudiag watch` options, after --")
    args = ap.parse_args()
    rows = [measure(n, args.seconds, args.settle, args.watch_args) for n in args.jobs]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "jobs  shown  CPU cores (whole run)  CPU cores (steady)  py-spy share  peak RSS MB  "
        "governor/job"
    )
    for r in rows:
        print(
            f"{r['jobs']:>4}  {r['jobs_shown']:>5}  {r['cpu_cores_whole_run']:>21.4f}  "
            f"{r['cpu_cores_steady'] or float('nan'):>18.4f}  {r['py_spy_share']:>12.2f}  "
            f"{r['peak_rss_mb']:>11.1f}  "
            f"{r['governor_cpu_cores_per_job_mean'] or float('nan'):>12.4f}"
        )


if __name__ == "__main__":
    main()
