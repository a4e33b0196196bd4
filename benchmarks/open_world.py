"""Issue 55's open-world check: planted causes inside the step (tests/workloads/
compute_open_world.py), each timed bare with its fix, then looked at by gpudiag.

For each job, one at a time: the bare fix (planted and --fixed alternately, --rounds interleaved
rounds of --bare-seconds, steps/s; the figure is the median of the rounds' ratios); then `gpudiag
run`, `gpudiag attach PID` and `gpudiag attach --hooks PID`, --looks times each (--look-seconds
of profiling); then the `gpudiag try` trial of the fix the first run look's top finding carries
(`try --from REPORT --finding ID`), if it carries one. Every timed part holds the box-wide
measurement lock (/work/measure.lock where it exists; --lock), released between parts.

    python benchmarks/open_world.py [--jobs frozen_grad lm_head ...] [--parts bare looks try]

--jobs also takes compute_planted.py's float64, loss_loop and checkpoint (not by default).

Prints a markdown table (job, bare x, each look's top finding and named place and whether the
verdict was sure, the trial's x and whether it is within +-25% of the bare x), the load average
beside each part, and writes the rows as JSON (--json).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.job_findings import job_findings  # noqa: E402

JOB = ROOT / "tests" / "workloads" / "compute_open_world.py"
sys.path.insert(0, str(JOB.parent))
from compute_open_world import CAUSES, CONTROLS  # noqa: E402  (the jobs, one list)

# planted jobs of other scripts: name -> the script and its arguments (compute_planted.py's
# earlier causes, with --jobs only)
OWN = {"broadcast_matmul": (JOB.parent / "broadcast_matmul.py",)}
EARLIER = {
    c: (JOB.parent / "compute_planted.py", c) for c in ("float64", "loss_loop", "checkpoint")
}

LOOKS = (("run", ()), ("attach", ()), ("attach --hooks", ("--hooks",)))
STEPS = re.compile(r"steps: (\d+) in ([\d.]+) s")
LEFT = re.compile(r"the job \(pid (\d+)\) keeps running")
LOCK: str | None = None


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


HELD = [0]  # locked() depth in this process (a job's parts run under its one hold)


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """The box-wide measurement lock around one job's timed parts, released between jobs
    (none when --lock is empty); nested calls hold it once."""
    if not LOCK or HELD[0]:
        HELD[0] += 1
        try:
            yield
        finally:
            HELD[0] -= 1
        return
    with open(LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        HELD[0] += 1
        try:
            yield
        finally:
            HELD[0] -= 1
            fcntl.flock(fh, fcntl.LOCK_UN)


def job_cmd(cause: str, fixed: bool, seconds: float) -> list[str]:
    script = OWN.get(cause) or EARLIER.get(cause) or (JOB, cause)
    cmd = [sys.executable, *map(str, script), "--seconds", str(seconds)]
    return cmd + (["--fixed"] if fixed else [])


def bare_rate(cause: str, fixed: bool, seconds: float) -> float:
    out = subprocess.run(
        job_cmd(cause, fixed, seconds), capture_output=True, text=True, timeout=seconds + 120
    ).stdout
    m = STEPS.search(out)
    if not m:
        raise SystemExit(f"{cause}: no step count in its output: {out[-200:]!r}")
    return int(m.group(1)) / float(m.group(2))


def bare(cause: str, seconds: float, rounds: int) -> dict:
    """Planted and fixed alternately (A B, B A, ...): the median of the rounds' ratios."""
    ratios, planted, fixed = [], [], []
    with locked():
        before = load()
        for r in range(rounds):
            arms: dict[bool, float] = {}
            for f in (False, True) if r % 2 == 0 else (True, False):
                arms[f] = bare_rate(cause, f, seconds)
            planted.append(arms[False])
            fixed.append(arms[True])
            ratios.append(arms[True] / arms[False])
        after = load()
    return {
        "x": statistics.median(ratios),
        "planted": [round(v, 2) for v in planted],
        "fixed": [round(v, 2) for v in fixed],
        "load": f"{before} / {after}",
    }


def gpudiag(*args: str, timeout: float) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [sys.executable, "-m", "gpudiag.agent.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    left = LEFT.search(res.stderr)
    if left:  # run --duration leaves the job running
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(left.group(1)), signal.SIGKILL)
    return res


def start_job(cause: str, seconds: float, ready: Path) -> subprocess.Popen:
    job = subprocess.Popen(
        job_cmd(cause, False, seconds),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "GPUDIAG_TEST_READY": str(ready)},
    )
    deadline = time.monotonic() + 120
    while not ready.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            raise SystemExit(f"{cause}: no first step")
        time.sleep(0.1)
    time.sleep(1.0)
    return job


def look(cause: str, how: str, extra: tuple[str, ...], seconds: float, tmp: Path) -> dict:
    """One look: its report's top job finding, the place it names, the verdict."""
    out = tmp / f"{cause}-{how.replace(' ', '')}-{time.monotonic_ns()}.json"
    common = ("-q", "--duration", str(seconds), "--out", str(out))
    with locked():
        before = load()
        if how == "run":
            res = gpudiag(
                "run", *common, "--", *job_cmd(cause, False, seconds + 60), timeout=seconds + 240
            )
        else:
            ready = tmp / f"ready-{time.monotonic_ns()}"
            job = start_job(cause, seconds + 90, ready)
            try:
                res = gpudiag("attach", str(job.pid), *extra, *common, timeout=seconds + 240)
            finally:
                job.kill()
                job.wait()
    if not out.exists():
        return {"how": how, "error": (res.stderr.strip().splitlines() or ["no report"])[-1]}
    return summarise(json.loads(out.read_text()), how, str(out), before)


def place(f: dict) -> str:
    """The place a finding names: its title's detail in brackets, else its location."""
    m = re.search(r" \((.+)\)\s*$", f.get("title", ""))  # "... ((optimizer) group 0)"
    if m:
        return m.group(1)
    return (f.get("location") or "").rsplit("/", 1)[-1]


def summarise(doc: dict, how: str, path: str, before: str) -> dict:
    found = job_findings(doc)
    serious = [f for f in found if f["severity"] in ("warning", "error")]
    top = found[0] if found else None
    comp = next((f for f in found if f["id"] == "COMP001"), None)
    v = doc.get("verdict") or {}
    return {
        "how": how,
        "hooks": hooks_status(doc),
        "stacks_top": stacks_top(doc),
        "report": path,
        "load": before,
        "top": None if top is None else f"{top['id']} {place(top)}".strip(),
        "top_severity": None if top is None else top["severity"],
        "top_speedup": None if top is None else top["expected_speedup"],
        "comp001": None if comp is None else f"{place(comp)} ({comp['severity']})",
        "comp_x": None if comp is None else comp.get("expected_speedup"),
        "serious": [f["id"] for f in serious],
        "verdict": v.get("finding"),
        "sure": bool(v.get("sure")),
        "statement": v.get("statement", ""),
        # the trial the top finding carries, else COMP001's
        "fix": (top or {}).get("fix") or (comp or {}).get("fix"),
        "fix_finding": (top or {}).get("id") if (top or {}).get("fix") else (comp or {}).get("id"),
    }


def hooks_status(doc: dict) -> str:
    """How the hooks got in (`run`'s own, or the injector `attach --hooks` used), from the
    hooks probe's status; "" when they were not there."""
    hp = next((p for p in doc.get("probes") or [] if p.get("name") == "hooks"), {})
    reason = hp.get("reason") or ""
    m = re.search(r" by ([\w.]+(?: \(Python [\d.]+\))?)", reason)
    if m:
        return m.group(1)
    return "" if "not connected" in reason else reason[:60]


def stacks_top(doc: dict) -> str | None:
    """Plain attach's named place: the top forward row of the report's compute_stacks (the
    call site the verdict's statement names first), with its share of the loop."""
    rows = (doc.get("compute_stacks") or {}).get("rows") or []
    fwd = next((r for r in rows if r.get("kind") in ("call", "own")), None)
    if fwd is None:
        return None
    site = fwd.get("site") or {}
    at = f"{str(site.get('file', '')).rsplit('/', 1)[-1]}:{site.get('line')}"
    what = fwd.get("module") or "own code"
    if fwd.get("kind") == "own":
        what = "model's own code"
    return f"{what} at {at} {fwd['share']:.0%}"


def trial(cause: str, report: str, finding: str, seconds: float, rounds: int, tmp: Path) -> dict:
    """`gpudiag try --from REPORT --finding ID` on the planted job (no report: `try --fix
    FINDING`, the fix itself): its measured x."""
    out = tmp / f"{cause}-try.json"
    which = ("--from", report, "--finding", finding) if report else ("--fix", finding)
    with locked():
        before = load()
        res = gpudiag(
            "try",
            *which,
            "--rounds",
            str(rounds),
            "--seconds",
            str(seconds),
            "--warmup",
            "3",
            "--out",
            str(out),
            "--",
            *job_cmd(cause, False, 900),
            timeout=rounds * 2 * (seconds + 120),
        )
    if not out.exists():
        return {"error": (res.stderr.strip().splitlines() or ["no report"])[-1], "load": before}
    trials = json.loads(out.read_text()).get("trials") or []
    if not trials:
        return {"error": "no trial", "load": before}
    t = trials[0]
    return {
        "x": t.get("measured"),
        "verdict": t.get("verdict"),
        "load": before,
        "fix": t.get("fix"),
        "applied": t.get("applied"),
        "output": res.stdout.strip().splitlines()[:2],  # what `try` printed (its first lines)
        "as_is": t.get("baseline_steps_per_s"),
        "fixed": t.get("fixed_steps_per_s"),
    }


def cell(lk: dict) -> str:
    if "error" in lk:
        return f"error: {lk['error'][:60]}"
    top = lk["top"] or "none"
    sure = "sure" if lk["sure"] else "not sure"
    comp = f"; COMP001 {lk['comp001']}" if lk["comp001"] and not top.startswith("COMP001") else ""
    x = lk.get("comp_x")
    comp += f" x{x:.2f}" if isinstance(x, (int, float)) and lk["comp001"] else ""
    st = f"; stacks: {lk['stacks_top']}" if lk.get("stacks_top") and not lk["comp001"] else ""
    return (
        f"{top}{comp}{st}; {lk['verdict'] or 'no bottleneck'}, {sure} "
        f"(load {lk['load'].split()[0]})"
    )


def table(rows: list[dict]) -> str:
    n = max(1, max(len(r["looks"]) for r in rows) // len(LOOKS))
    head = "| job | bare x (load) | " + " | ".join(
        f"{h} {i + 1}" for h, _ in LOOKS for i in range(n)
    )
    lines = [head + " | try x | within ±25% |"]
    lines.append("|" + "---|" * (lines[0].count("|") - 1))
    for r in rows:
        b = r.get("bare")
        bx = f"x{b['x']:.2f} ({b['load'].split()[0]})" if b else "-"
        looks = [cell(lk) for lk in sorted(r["looks"], key=lambda lk: LOOKS_ORDER[lk["how"]])]
        looks += ["-"] * (n * len(LOOKS) - len(looks))
        t = r.get("try")
        tx = "-" if not t else (f"x{t['x']:.2f}" if t.get("x") else t.get("error", "-"))
        within = "-"
        if t and t.get("x") and b:
            within = "yes" if abs(t["x"] / b["x"] - 1) <= 0.25 else "no"
        lines.append(f"| {r['job']} | {bx} | " + " | ".join(looks) + f" | {tx} | {within} |")
    return "\n".join(lines)


LOOKS_ORDER = {h: i for i, (h, _) in enumerate(LOOKS)}


def again(lk: dict) -> dict:
    """A look's summary read again from its report where it is still there."""
    path = lk.get("report")
    if not path or not Path(path).exists():
        return lk
    return summarise(json.loads(Path(path).read_text()), lk["how"], path, lk["load"])


def merged(paths: list[str]) -> list[dict]:
    """Rows of earlier runs by job, in file order: a later row's parts (bare, looks, try)
    replace an earlier one's."""
    rows: dict[str, dict] = {}
    for path in paths:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            old = rows.setdefault(row["job"], {"job": row["job"], "looks": []})
            for part in ("bare", "try"):
                if part in row:
                    old[part] = row[part]
            if row.get("looks"):
                old["looks"] = [again(lk) for lk in row["looks"]]
    return list(rows.values())


def main() -> None:
    global LOCK
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--jobs",
        nargs="+",
        default=[*CAUSES, *OWN, *CONTROLS],
        choices=[*CAUSES, *OWN, *EARLIER, *CONTROLS],
    )
    p.add_argument("--parts", nargs="+", default=["bare", "looks", "try"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bare-seconds", type=float, default=5.0)
    p.add_argument("--looks", type=int, default=2, help="looks of each kind")
    p.add_argument("--look-seconds", type=float, default=20.0)
    p.add_argument("--try-seconds", type=float, default=6.0)
    p.add_argument(
        "--try-fix",
        default="",
        metavar="KIND:TARGET...",
        help="with --parts try and no run look: try this fix (`try --fix`) instead of the one "
        "the first run look's finding carries",
    )
    p.add_argument("--lock", default="/work/measure.lock" if Path("/work").exists() else "")
    p.add_argument("--json", default="", help="append each job's row here (JSON lines)")
    p.add_argument(
        "--table",
        nargs="+",
        default=[],
        metavar="JSONL",
        help="print the table of rows written by earlier runs (--json), a later run's parts "
        "replacing an earlier one's, and run nothing",
    )
    a = p.parse_args()
    if a.table:
        print(table(merged(a.table)))
        return
    LOCK = a.lock if a.lock and Path(a.lock).exists() else None
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory(prefix="open-world-") as d:
        tmp = Path(os.environ.get("OPEN_WORLD_KEEP", d))
        tmp.mkdir(parents=True, exist_ok=True)
        for cause in a.jobs:
            with locked():
                rows.append(one_job(cause, a, tmp))
    if rows:
        print(table(rows))


def one_job(cause: str, a: argparse.Namespace, tmp: Path) -> dict:
    """One job's parts (bare, looks, try), as asked."""
    row: dict = {"job": cause, "looks": []}
    if "bare" in a.parts and cause not in CONTROLS:
        row["bare"] = bare(cause, a.bare_seconds, a.rounds)
        print(f"{cause} bare: {row['bare']}", flush=True)
    if "looks" in a.parts:
        for _ in range(a.looks):
            for how, extra in LOOKS:
                lk = look(cause, how, extra, a.look_seconds, tmp)
                row["looks"].append(lk)
                print(f"{cause} {how}: {cell(lk)}", flush=True)
    first = next((lk for lk in row["looks"] if lk["how"] == "run" and "top" in lk), None)
    if "try" in a.parts and first and first["fix"]:
        row["try"] = trial(
            cause, first["report"], first["fix_finding"], a.try_seconds, a.rounds, tmp
        )
    elif "try" in a.parts and a.try_fix:
        row["try"] = trial(cause, "", a.try_fix, a.try_seconds, a.rounds, tmp)
        print(f"{cause} try: {row['try']}", flush=True)
    if a.json:
        with open(a.json, "a") as fh:
            fh.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    main()
