"""How stable gpudiag's verdicts are, measured the way a user sees them.

Each planted workload in tests/workloads/ is profiled N times in each mode (`run`, `attach`),
on an idle box and on a loaded one (a second process burning one core for the whole time).
For each workload / mode / load it prints how often the top serious finding is the planted
truth, how often it agrees with itself (the modal id), how often the verdict was "not sure",
and the loop stack samples and the agent's CPU (cores) per look. Progress goes to stderr, the
table to stdout, everything as JSON with `--json PATH`.

    python benchmarks/stability.py --n 10 --seconds 15           # the full run (long)
    python benchmarks/stability.py --quick                        # 2 workloads, N=2, idle only

The truth of the starved loader (a loader that computes, num_workers=0) is DATA001 whatever
the box's idle cores (they grade its advice); DATA002 is kept for the job's own workers
filling the cores (saturated_workers).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

WORKLOADS = Path(__file__).resolve().parent.parent / "tests" / "workloads"
GPUDIAG = [sys.executable, "-m", "gpudiag.agent.cli.main"]
TRUTH: dict[str, str | None] = {
    "healthy": None,
    "starved_loader": "DATA001",
    "saturated_workers": "DATA002",
    "storage_bound": "IO001",
    "gil_contention": "GIL001",
    "sync_checkpoint": "CKPT001",
    "inline_tokenizer": "HOST001",
    "waiting_loader": "DATA001",  # a loader that waits (off-CPU): more workers, not DATA002
    "gil_mlp": "GIL001",  # three pure-Python threads competing for the GIL
    "metrics_post": "BLOCK001",  # a metrics POST to a slow collector every step
    "eval_in_loop": "EVAL001",  # a held-out pass every 10 steps
    "oversubscribed_threads": "HOST003",  # torch.set_num_threads(16) on the box's cores
    "respawned_workers": "DATA003",  # workers re-created each epoch with a costly init
    "batch_embed": "INFER001",  # a batch-embedding loop with autograd on
}
# ids also right for a workload (none: DATA001 is graded by the idle cores, never renamed)
SAME_CAUSE: dict[str, set[str]] = {}  # one cause, one id: the loader-bound loop is DATA001
# attached with --hooks: an inference job's causes (batch per forward, autograd mode) are
# judged from its forwards, which only the in-process hooks see (without them the verdict is
# "not judged", never sure)
ATTACH_HOOKS = {"batch_embed"}
QUICK = ["starved_loader", "sync_checkpoint"]
ATTACH_WARMUP_S = 5.0  # past the imports: attach to a job that is training
BURN = "import time\nwhile True:\n    sum(range(10000))\n"


@contextmanager
def busy_core(on: bool) -> Iterator[None]:
    """A process burning one core while the block runs (always killed), or nothing."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _top(doc: dict) -> str | None:
    serious = [f["id"] for f in doc["findings"] if f["severity"] in ("warning", "error")]
    return serious[0] if serious else None


def _end_job(report: Path) -> None:
    """Kill the job a `run` look left running (and its DataLoader workers)."""
    try:
        pid = int(json.loads(report.read_text())["run"]["pid"])
        proc = psutil.Process(pid)
        for p in [*proc.children(recursive=True), proc]:
            p.kill()
        psutil.wait_procs([proc], timeout=10)
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        pass


def look(name: str, mode: str, seconds: float, out: Path) -> dict:
    """One look at one workload in one mode: the report's top id, verdict and cost."""
    job_s = str(seconds + ATTACH_WARMUP_S + 10)
    cmd = [sys.executable, str(WORKLOADS / f"{name}.py"), "--seconds", job_s]
    dur = ["-q", "--duration", str(seconds), "--out", str(out)]
    job = None
    try:
        if mode == "run":
            # not a pipe: the job keeps running after the look (run --duration) and would hold
            # it open; it is ended below from the report's pid
            with tempfile.TemporaryFile("w+") as log:
                res = subprocess.run(
                    [*GPUDIAG, "run", *dur, "--", *cmd],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    text=True,
                    timeout=300,
                )
                log.seek(0)
                res.stderr = log.read()
            _end_job(out)
        else:
            job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(ATTACH_WARMUP_S)
            hooks = ["--hooks"] if name in ATTACH_HOOKS else []
            res = subprocess.run(
                [*GPUDIAG, "attach", str(job.pid), *hooks, *dur],
                capture_output=True,
                text=True,
                timeout=300,
            )
    finally:
        if job is not None:
            job.kill()
            job.wait()
    if res.returncode != 0 or not out.exists():
        return {"error": (res.stderr or res.stdout).strip()[-300:]}
    doc = json.loads(out.read_text())
    verdict = doc.get("verdict") or {}
    agent = doc["run"].get("agent") or {}
    return {
        "top": _top(doc),
        "sure": bool(verdict.get("sure")),
        # a top finding whose fix's effect is a hypothesis is never sure until `try` measures
        # it: named and consistent is its right answer
        "hypothesis": "unverified" in (verdict.get("statement") or ""),
        "samples": doc["breakdown"].get("samples"),
        "agent_cpu_cores": agent.get("cpu_cores"),
    }


def _judged(x: dict) -> bool:
    """A sure verdict, or a named hypothesis (sure only once `try` measures it)."""
    return bool(x["sure"] or (x.get("hypothesis") and x["top"]))


def summarize(name: str, looks: list[dict], load: str = "idle") -> dict:
    """Agreement with the truth and with itself, "not sure" share, samples and cost. Beside
    the burner HOST002 (the other process) is right too: there a timed fix showed the core it
    takes moves the held-out jobs more than their planted fixes (docs/how-it-measures.md)."""
    truth = TRUTH[name]
    right_ids = SAME_CAUSE.get(name, {truth}) | ({"HOST002"} if load == "loaded" else set())
    ok = [x for x in looks if "error" not in x]
    tops = [x["top"] for x in ok if _judged(x)]
    modal, modal_n = Counter(tops).most_common(1)[0] if tops else (None, 0)
    samples = [x["samples"] for x in ok if x.get("samples") is not None]
    cpu = [x["agent_cpu_cores"] for x in ok if x.get("agent_cpu_cores") is not None]
    return {
        "n": len(looks),
        "errors": len(looks) - len(ok),
        "right": sum(1 for x in ok if _judged(x) and x["top"] in right_ids),
        "modal": modal,
        "modal_n": modal_n,
        "not_sure": sum(1 for x in ok if not x["sure"]),
        "wrong_sure": sum(1 for x in ok if _judged(x) and x["top"] not in right_ids),
        "samples_median": statistics.median(samples) if samples else None,
        "samples_min": min(samples) if samples else None,
        "agent_cpu_median": round(statistics.median(cpu), 4) if cpu else None,
    }


def table(rows: list[dict]) -> str:
    """The results as a Markdown table."""
    head = (
        "| workload | truth | mode | load | right | modal id (n) | not sure | sure & wrong "
        "| loop samples median (min) | agent CPU (cores) |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        s = r["summary"]
        lines.append(
            f"| {r['workload']} | {TRUTH[r['workload']] or '(none)'} | {r['mode']} | {r['load']} "
            f"| {s['right']}/{s['n']} | {s['modal'] or '(none)'} ({s['modal_n']}) "
            f"| {s['not_sure']} | {s['wrong_sure']} "
            f"| {s['samples_median']} ({s['samples_min']}) | {s['agent_cpu_median']} |"
        )
    return head + "\n".join(lines)


def totals(rows: list[dict]) -> str:
    """Per workload, over every mode and load: right / looks, and the 1-min load average's
    range while it ran."""
    out = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == name]
        right = sum(r["summary"]["right"] for r in mine)
        n = sum(r["summary"]["n"] for r in mine)
        loads = [x["load1"] for r in mine for x in r["looks"] if "load1" in x]
        span = f", load {min(loads):.1f}-{max(loads):.1f}" if loads else ""
        out.append(f"{name}: {right}/{n} right{span}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=10, help="looks per workload, mode and load")
    ap.add_argument("--seconds", type=float, default=15.0, help="--duration of each look")
    ap.add_argument("--workloads", nargs="*", default=list(TRUTH), choices=list(TRUTH))
    ap.add_argument("--modes", nargs="*", default=["run", "attach"], choices=["run", "attach"])
    ap.add_argument("--loads", nargs="*", default=["idle", "loaded"], choices=["idle", "loaded"])
    ap.add_argument("--quick", action="store_true", help="2 workloads, N=2, idle, run+attach")
    ap.add_argument("--json", metavar="PATH", help="write every look and summary as JSON")
    args = ap.parse_args(argv)
    if args.n < 1 or args.seconds <= 0:
        print("stability: --n must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    if args.quick:
        args.n, args.workloads, args.loads = 2, QUICK, ["idle"]
    rows: list[dict] = []
    total = len(args.workloads) * len(args.modes) * len(args.loads) * args.n
    done = 0
    with tempfile.TemporaryDirectory(prefix="gpudiag-stability-") as tmp:
        for load in args.loads:
            with busy_core(load == "loaded"):
                for name in args.workloads:
                    for mode in args.modes:
                        looks = []
                        for i in range(args.n):
                            x = look(name, mode, args.seconds, Path(tmp) / f"{done}.json")
                            x["load1"] = round(os.getloadavg()[0], 2)  # the box as it was
                            looks.append(x)
                            done += 1
                            print(
                                f"[{done}/{total}] {name} {mode} {load} #{i + 1}: {x}",
                                file=sys.stderr,
                                flush=True,
                            )
                        rows.append(
                            {
                                "workload": name,
                                "mode": mode,
                                "load": load,
                                "looks": looks,
                                "summary": summarize(name, looks, load),
                            }
                        )
    print(table(rows))
    print(totals(rows))
    if args.json:
        meta = {"n": args.n, "seconds": args.seconds, "date": time.strftime("%Y-%m-%d %H:%M")}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
