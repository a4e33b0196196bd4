"""`gpudiag try` on the planted workloads: predicted vs measured per fix, and the hand-made
change timed separately (the workload's code edited to the fix's values, run alternately
with the original; rate = steps it printed / its --seconds).

    python benchmarks/try_bench.py --workloads starved_loader sync_checkpoint \
        --diagnose-seconds 40 --rounds 3 --seconds 10 --hand-seconds 20

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

WORKLOADS = Path(__file__).resolve().parent.parent / "tests" / "workloads"
# how the hand-made change is written into each workload's source, per fix kind
EDITS = {
    "dataloader": lambda src, v: src.replace(
        "num_workers=0", "num_workers={num_workers}, persistent_workers=True".format(**v)
    ),
    "checkpoint": lambda src, v: src.replace("step % 10 == 0", f"step % {10 * v['every']} == 0"),
}


def cli(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run gpudiag, its stderr passed through (progress)."""
    return subprocess.run(
        [sys.executable, "-m", "gpudiag.agent.cli", *args],
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout,
    )


def steps_per_s(script: Path, seconds: float) -> float:
    """Run a workload for `seconds`; its printed step count over the seconds."""
    out = subprocess.run(
        [sys.executable, str(script), "--seconds", str(seconds)],
        capture_output=True,
        text=True,
        cwd=WORKLOADS,
        timeout=seconds * 4 + 120,
    ).stdout
    found = re.findall(r"steps: (\d+)", out)
    if not found:
        raise SystemExit(f"{script.name}: no step count printed")
    return int(found[-1]) / seconds


def hand_made(name: str, fix: dict, rounds: int, seconds: float) -> tuple[float, list, list]:
    """The fix written into a copy of the workload, timed alternately with the original."""
    src = (WORKLOADS / f"{name}.py").read_text()
    edited = EDITS[fix["kind"]](src, fix["values"])
    if edited == src:
        raise SystemExit(f"{name}: the hand-made {fix['kind']} edit did not apply")
    copy = WORKLOADS / f"_hand_{name}.py"
    copy.write_text(edited)
    base, fixed = [], []
    try:
        for r in range(rounds):
            for arm in ("a", "b") if r % 2 == 0 else ("b", "a"):
                script = copy if arm == "b" else WORKLOADS / f"{name}.py"
                (fixed if arm == "b" else base).append(steps_per_s(script, seconds))
    finally:
        copy.unlink()
    return statistics.median(fixed) / statistics.median(base), base, fixed


def bench(name: str, args: argparse.Namespace, folder: str) -> list[dict]:
    """Diagnose, try every fix the report carries, time the hand-made change."""
    report = os.path.join(folder, f"{name}.json")
    job = [sys.executable, f"{name}.py", "--seconds"]
    os.chdir(WORKLOADS)
    cli("run", "--out", report, "--", *job, str(args.diagnose_seconds))
    trials_out = os.path.join(folder, f"{name}-try.json")
    doc = json.load(open(report)) if os.path.exists(report) else {}
    found = [f["id"] for f in doc.get("findings") or []]
    source = ["--from", report]
    if not any(f.get("fix") for f in doc.get("findings") or []):
        if name not in args.fix:
            return [{"workload": name, "error": f"no fix in the diagnosis ({found})"}]
        source = ["--fix", args.fix[name]]  # the planted cause's fix, no prediction
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
        *job,
        "3600",
    )
    print(r.stdout, file=sys.stderr)
    if not os.path.exists(trials_out):
        return [{"workload": name, "error": "no fix to try in the report"}]
    rows = []
    for t in json.load(open(trials_out))["trials"]:
        row = {"workload": name, "diagnosed": found, **t}
        if t["fix"]["kind"] in EDITS:
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
    p.add_argument("--workloads", nargs="+", default=["starved_loader", "sync_checkpoint"])
    p.add_argument("--diagnose-seconds", type=float, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--hand-seconds", type=float, default=20)
    p.add_argument("--json", help="also write the rows here")
    p.add_argument(
        "--fix",
        nargs="*",
        default=["starved_loader=dataloader:num_workers=1", "sync_checkpoint=checkpoint:every=4"],
        metavar="WORKLOAD=FIX",
        help="the fix to try when the diagnosis carries none (then no prediction)",
    )
    args = p.parse_args()
    args.fix = dict(item.split("=", 1) for item in args.fix)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gpudiag-try-bench-") as folder:
        for name in args.workloads:
            rows += bench(name, args, folder)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
