"""`gpudiag try` on the planted workloads, the demo's job and public training scripts:
predicted vs measured per fix, and the hand-made change timed separately (a planted
workload's or the demo's code edited to the fix's values, a public script run with the flag
that makes the same change; run alternately with the original; rate = steps it printed over
its seconds).

    python benchmarks/try_bench.py --workloads demo starved_loader sync_checkpoint \
        --public hf_trainer lightning_ckpt --diagnose-seconds 40 --rounds 3 --seconds 10

Prints a Markdown table (for docs/try.md) with the date and machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "tests" / "workloads"
PUBLIC = ROOT / "tests" / "public"
DEMO = ROOT / "agent" / "commands" / "demo_job.py"  # `gpudiag demo`'s job: a loader-bound loop
# public script -> (its path, the flags that make a tried fix by hand, per fix kind)
PUBLIC_FLAGS = {
    "hf_trainer": (
        "hf_trainer/main.py",
        {"dataloader": lambda v: ["--workers", str(v["num_workers"])]},
    ),
    "mnist": ("mnist/main.py", {"dataloader": lambda v: ["--workers", str(v["num_workers"])]}),
    "lightning_ckpt": (
        "lightning_ckpt/main.py",
        {"checkpoint": lambda v: ["--ckpt-every", str(5 * int(v["every"]))]},
    ),
}
STEPS = re.compile(r"steps: (\d+) in ([0-9.]+) s|steps: (\d+)|(\d+) steps")
# how the hand-made change is written into each workload's source, per fix kind
EDITS = {
    "dataloader": lambda src, v: src.replace(
        "num_workers=0", "num_workers={num_workers}, persistent_workers=True".format(**v)
    ),
    "checkpoint": lambda src, v: src.replace("step % 10 == 0", f"step % {10 * v['every']} == 0"),
}


def cli(*args: str, env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run gpudiag, its stderr passed through (progress)."""
    return subprocess.run(
        [sys.executable, "-m", "gpudiag.agent.cli.main", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        timeout=timeout,
    )


def script_of(name: str) -> Path:
    """The file of a planted workload, the demo's job or a public script."""
    if name == "demo":
        return DEMO
    if name in PUBLIC_FLAGS:
        return PUBLIC / PUBLIC_FLAGS[name][0]
    return WORKLOADS / f"{name}.py"


def job_argv(name: str, seconds: float, script: Path | None = None) -> tuple[list, dict]:
    """The command and environment that run a job for about `seconds`."""
    script = script or script_of(name)
    if name in PUBLIC_FLAGS:  # public scripts bound their training by PUBLIC_SECONDS
        env = {**os.environ, "PUBLIC_SECONDS": str(seconds), "PYTHONUNBUFFERED": "1"}
        return [sys.executable, str(script)], env
    return [sys.executable, str(script), "--seconds", str(seconds)], dict(os.environ)


def rate_of(output: str, seconds: float) -> float | None:
    """Steps per second from a job's last step-count line."""
    found = STEPS.findall(output)
    if not found:
        return None
    n_in, secs, n_plain, n_demo = found[-1]
    if n_in:
        return int(n_in) / float(secs) if float(secs) > 0 else None
    return int(n_plain or n_demo) / seconds


def steps_per_s(name: str, seconds: float, script: Path | None = None, extra=()) -> float:
    """Run a job for `seconds`; its printed steps over its time."""
    argv, env = job_argv(name, seconds, script)
    out = subprocess.run(
        [*argv, *extra],
        capture_output=True,
        text=True,
        cwd=WORKLOADS,
        env=env,
        timeout=seconds * 4 + 180,
    ).stdout
    rate = rate_of(out, seconds)
    if rate is None:
        raise SystemExit(f"{name}: no step count printed")
    return rate


def hand_made(name: str, fix: dict, rounds: int, seconds: float) -> tuple[float, list, list]:
    """The fix made by hand, timed alternately with the original: a public script with its
    flag, a planted workload or the demo's job as an edited copy of its code."""
    copy, extra = None, []
    if name in PUBLIC_FLAGS:
        extra = PUBLIC_FLAGS[name][1][fix["kind"]](fix["values"])
    else:
        src = script_of(name).read_text()
        edited = EDITS[fix["kind"]](src, fix["values"])
        if edited == src:
            raise SystemExit(f"{name}: the hand-made {fix['kind']} edit did not apply")
        copy = WORKLOADS / f"_hand_{name}.py"
        copy.write_text(edited)
    base, fixed = [], []
    try:
        for r in range(rounds):
            for arm in ("a", "b") if r % 2 == 0 else ("b", "a"):
                if arm == "b":
                    fixed.append(steps_per_s(name, seconds, copy, extra))
                else:
                    base.append(steps_per_s(name, seconds))
    finally:
        if copy is not None:
            copy.unlink()
    return statistics.median(fixed) / statistics.median(base), base, fixed


def has_hand(name: str, kind: str) -> bool:
    """Whether the benchmark can make this fix by hand for this job."""
    if name in PUBLIC_FLAGS:
        return kind in PUBLIC_FLAGS[name][1]
    return kind in EDITS


def end_job(report: str) -> None:
    """End the job a `run --duration` look left running."""
    from gpudiag.agent.commands.tryfix import end_job as end

    end(report)


def bench(name: str, args: argparse.Namespace, folder: str) -> list[dict]:
    """Diagnose, try every fix the report carries, time the hand-made change."""
    report = os.path.join(folder, f"{name}.json")
    os.chdir(WORKLOADS)
    argv, env = job_argv(name, args.diagnose_seconds)
    look = ["--until-sure", "--duration", str(args.diagnose_seconds)]
    cli("run", "-q", *look, "--out", report, "--", *argv, env=env)
    if os.path.exists(report):
        end_job(report)
    trials_out = os.path.join(folder, f"{name}-try.json")
    doc = json.load(open(report)) if os.path.exists(report) else {}
    found = [f["id"] for f in doc.get("findings") or []]
    source = ["--from", report]
    if not any(f.get("fix") for f in doc.get("findings") or []):
        if name not in args.fix:
            return [{"workload": name, "error": f"no fix in the diagnosis ({found})"}]
        source = ["--fix", args.fix[name]]  # the planted cause's fix, no prediction
    argv, env = job_argv(name, 3600)
    r = cli(
        "try",
        *source,
        "--rounds",
        str(args.rounds),
        "--seconds",
        str(args.seconds),
        "--out",
        trials_out,
        "--",
        *argv,
        env=env,
    )
    print(r.stdout, file=sys.stderr)
    if not os.path.exists(trials_out):
        return [{"workload": name, "error": "no fix to try in the report"}]
    rows = []
    for t in json.load(open(trials_out))["trials"]:
        row = {"workload": name, "diagnosed": found, **t}
        if has_hand(name, t["fix"]["kind"]):
            row["hand"], row["hand_base"], row["hand_fixed"] = hand_made(
                name, t["fix"], args.rounds, args.hand_seconds
            )
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table of the rows."""
    lines = [
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on "
        f"{platform.node() or 'this machine'}: {os.cpu_count()} CPUs, {platform.machine()}, "
        f"Python {platform.python_version()} (shared with other work)",
        "",
        "| workload | finding | fix | predicted | try: measured [95% interval] | rounds | "
        "verdict | hand-made change | hand-made inside interval |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['error']} | | | | | | | |")
            continue
        vals = ", ".join(f"{k}={v}" for k, v in r["fix"]["values"].items())
        iv = r.get("interval") or [None, None]
        meas = f"x{r['measured']:.2f} [{iv[0]:.2f}, {iv[1]:.2f}]" if r["measured"] else "-"
        pred = f"x{r['predicted']:.2f}" if r.get("predicted") else "-"
        hand = r.get("hand")
        finding = r.get("finding") or "none: " + ",".join(r["diagnosed"])
        inside = "yes" if hand and iv[0] is not None and iv[0] <= hand <= iv[1] else "no"
        lines.append(
            f"| {r['workload']} | {finding} | {r['fix']['kind']}({vals}) | "
            f"{pred} | {meas} | {r['rounds']} | {r['verdict']} | "
            f"{f'x{hand:.2f}' if hand else '-'} | {inside if hand else '-'} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--workloads",
        nargs="*",
        default=["demo", "starved_loader", "sync_checkpoint"],
        help="planted workloads (tests/workloads) or demo (gpudiag demo's job)",
    )
    p.add_argument(
        "--public",
        nargs="*",
        default=["hf_trainer", "mnist", "lightning_ckpt"],
        choices=sorted(PUBLIC_FLAGS),
        help="public training scripts (tests/public)",
    )
    p.add_argument("--diagnose-seconds", type=float, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--hand-seconds", type=float, default=20)
    p.add_argument("--json", help="also write the rows here")
    p.add_argument(
        "--fix",
        nargs="*",
        default=[
            "starved_loader=dataloader:num_workers=1",
            "demo=dataloader:num_workers=1",
            "sync_checkpoint=checkpoint:every=4",
            # on a box without idle cores DATA001 carries no workers fix ("make loading
            # cheaper"): try one anyway, to measure what more workers would give
            "hf_trainer=dataloader:num_workers=1",
            "mnist=dataloader:num_workers=1",
        ],
        metavar="WORKLOAD=FIX",
        help="the fix to try when the diagnosis carries none (then no prediction)",
    )
    args = p.parse_args()
    args.fix = dict(item.split("=", 1) for item in args.fix)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gpudiag-try-bench-") as folder:
        for name in [*args.workloads, *args.public]:
            print(f"try_bench: {name}", file=sys.stderr, flush=True)
            rows += bench(name, args, folder)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
