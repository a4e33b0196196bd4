"""`attach --hooks` on a public script nobody here wrote: the Hugging Face Trainer run of
tests/public/hf_trainer (run_glue.py's model and Trainer, tokenising each batch in the
collator), as a user would attach to it.

Rounds of two looks, the order alternating: the job started bare, then after its imports
either `gpudiag attach PID` or `gpudiag attach PID --hooks` for `--seconds`. The job logs the
time of every step (tests/public/stepclock.py's PUBLIC_STEP_LOG). Per look: the job's own
steps/s over the look (from its step log, between the look's start and end as the report
gives them), the report's steps/s and how it got it, the hooks' line, the top finding. The
cost of the hooks: the job's own rate under `--hooks` over its rate under plain `attach`
(median over the rounds; both looks sample stacks alike); and the report's steps/s against
the job's own.

    python benchmarks/attach_hooks_public.py --rounds 2 --seconds 20
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
from datetime import datetime
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "public" / "hf_trainer" / "main.py"
WARMUP_S = 12.0  # transformers' imports and the first steps on a busy 2-core box


def one_look(hooks: bool, seconds: int, folder: Path) -> dict:
    """One job, one look; what the job and the report say."""
    log = folder / f"steps-{hooks}.json"
    env = {**os.environ, "PUBLIC_SECONDS": str(seconds + WARMUP_S + 30)}
    env["PUBLIC_STEP_LOG"] = str(log)
    job = subprocess.Popen(
        [sys.executable, str(SCRIPT)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(WARMUP_S)
        out = folder / f"r-{hooks}.json"
        argv = [sys.executable, "-m", "gpudiag.agent.cli.main", "attach", str(job.pid), "-q"]
        argv += ["--hooks"] if hooks else []
        argv += ["--duration", str(seconds), "--out", str(out)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 240)
        if res.returncode != 0:
            raise SystemExit(f"attach failed: {res.stderr.strip()[-300:]}")
    finally:
        job.terminate()  # stepclock writes its log on SIGTERM
        job.wait(timeout=60)
    doc = json.loads(out.read_text())
    times = json.loads(log.read_text())
    t0 = datetime.fromisoformat(doc["run"]["start"].replace("Z", "+00:00")).timestamp()
    t1 = t0 + doc["run"]["duration_s"]
    seen = [t for t in times if t0 <= t <= t1]
    probe = next((p for p in doc["probes"] if p["name"] == "hooks"), {})
    top = next((f for f in doc["findings"] if f["severity"] in ("warning", "error")), None)
    return {
        "own": (len(seen) - 1) / (seen[-1] - seen[0]) if len(seen) > 1 else 0.0,
        "report": doc["metrics"].get("steps_per_second"),
        "hooks": probe.get("reason", ""),
        "top": f"{top['id']} ({top['confidence']:.0%})" if top else "none",
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=20)
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    ratios, agree = [], []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            order = (False, True) if i % 2 == 0 else (True, False)
            looks = {h: one_look(h, args.seconds, Path(tmp)) for h in order}
        plain, hooked = looks[False], looks[True]
        if not (plain["own"] and hooked["own"]):
            raise SystemExit(f"a look saw under two steps: {plain}, {hooked}")
        ratios.append(hooked["own"] / plain["own"])
        if hooked["report"]:
            agree.append(hooked["report"] / hooked["own"])
        print(
            f"round {i + 1}: job's own steps/s under attach {plain['own']:.2f}, under attach "
            f"--hooks {hooked['own']:.2f} (x{ratios[-1]:.3f}); reports: {plain['report']} "
            f"(stacks), {hooked['report']} (hooks: {hooked['hooks'][:90]}); top finding "
            f"{plain['top']} / {hooked['top']} (load average {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    print(
        f"hf_trainer: job speed under attach --hooks / under attach, median over {args.rounds}"
        f" rounds x{statistics.median(ratios):.3f}; the hooked report's steps/s / the job's own"
        f" {statistics.median(agree) if agree else float('nan'):.3f} (load average {load0:.2f} "
        f"at the start, {os.getloadavg()[0]:.2f} at the end)"
    )


if __name__ == "__main__":
    main()
