"""Issue 55's public fine-tuning scripts: a fix timed bare, and gpudiag's looks at the job.

`time`: the script bare (A) and with its fix flag (B), in pairs A B, B A, A B ... (`--rounds`),
each run `--seconds` of steps after its warm-up (tests/public/stepclock.py); per pair the
ratio B/A of steps/s, and their median; per run its median step time (the step's own speed,
apart from the long evaluation or checkpoint steps the rate holds: a fix that removes those
should leave it as it is) and the 1-minute load average before and after.
`look`: one `gpudiag run`, `gpudiag attach PID` or `gpudiag attach --hooks PID` of the bare
script (attach `--warmup` seconds after the job starts: past its imports and data
preparation); the report's verdict, top finding, its prediction and trial.

    python benchmarks/public_finetune.py time trl_sft --rounds 3 --seconds 45
    python benchmarks/public_finetune.py look trl_sft --mode run --seconds 45 --out r.json

Scripts: the `tests/public/` names of benchmarks/public_scripts.py (trl_sft, st_sts, ...).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from public_scripts import BY_NAME, _stop, job_cmd, job_env, rate_of, verdict_of  # noqa: E402


def load() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def step_p50(times: list[float], warmup: int = 3) -> float | None:
    """The median time between consecutive steps after the warm-up: the step's own speed,
    apart from the rare long ones (an evaluation pass, a checkpoint) that the rate holds."""
    gaps = [b - a for a, b in zip(times[warmup - 1 :], times[warmup:], strict=False)]
    return round(statistics.median(gaps), 4) if gaps else None


def one_run(name: str, fixed: bool, seconds: float) -> dict:
    """The script's steps/s over `seconds` after its warm-up, its median step time (each
    step's time logged by stepclock.py), and the load around it."""
    before = load()
    with tempfile.TemporaryDirectory(prefix="public-finetune-") as tmp:
        log = Path(tmp) / "steps.json"
        res = subprocess.run(
            job_cmd(BY_NAME[name], fixed),
            env={**job_env(seconds), "PUBLIC_STEP_LOG": str(log)},
            capture_output=True,
            text=True,
            timeout=seconds + 300,
        )
        times = json.loads(log.read_text()) if log.exists() else []
    return {
        "fixed": fixed,
        "rate": rate_of(res.stdout),
        "step_p50_s": step_p50(times),
        "steps": len(times),
        "load": [before, load()],
    }


def time_fix(name: str, rounds: int, seconds: float) -> dict:
    """Pairs A B, B A, ...: each pair's ratio fixed/bare and the median ratio."""
    pairs = []
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        runs = {fixed: one_run(name, fixed, seconds) for fixed in order}
        a, b = runs[False]["rate"], runs[True]["rate"]
        ratio = b / a if a and b else None
        pairs.append({"bare": runs[False], "fixed": runs[True], "ratio": ratio})
        print(json.dumps(pairs[-1]), file=sys.stderr, flush=True)
    ratios = [p["ratio"] for p in pairs if p["ratio"]]
    return {
        "script": name,
        "fix": " ".join(BY_NAME[name].fix),
        "seconds": seconds,
        "pairs": pairs,
        "median_ratio": statistics.median(ratios) if ratios else None,
    }


def one_look(
    name: str, mode: str, seconds: float, out: Path, warmup: float, fixed: bool = False
) -> dict:
    """One look at the bare script (with its fix flag when `fixed`); the verdict, the top
    finding's prediction and trial."""
    cli = [sys.executable, "-m", "gpudiag.agent.cli.main"]
    before, job = load(), None
    if mode == "run":
        cmd = [*cli, "run", "-q", "--duration", str(seconds), "--out", str(out), "--"]
        res = subprocess.run(
            cmd + job_cmd(BY_NAME[name], fixed),
            env=job_env(seconds + 60),
            capture_output=True,
            text=True,
            timeout=seconds + 400,
        )
    else:
        job = subprocess.Popen(
            job_cmd(BY_NAME[name], fixed),
            env=job_env(seconds + warmup + 60),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(warmup)
        hooks = ["--hooks"] if mode == "hooks" else []
        cmd = [*cli, "attach", *hooks, str(job.pid), "-q", "--duration", str(seconds)]
        res = subprocess.run(
            [*cmd, "--out", str(out)], capture_output=True, text=True, timeout=seconds + 300
        )
    try:
        if not out.exists():
            return {"error": (res.stderr or res.stdout)[-500:], "mode": mode}
        report = json.loads(out.read_text())
        _stop(report.get("run", {}).get("pid") if mode == "run" else None)
        v = verdict_of(report)
        top = next((f for f in report.get("findings", []) if f["id"] == v["top"]), {})
        probes = {p.get("name"): p.get("available") for p in report.get("probes", [])}
        return {
            "mode": mode,
            **v,
            "title": top.get("title"),
            "fix": top.get("fix"),
            "hooks": probes.get("hooks"),
            "load": [before, load()],
            "report": str(out),
        }
    finally:
        if job is not None:
            _stop(job.pid)
            job.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("time", "look"))
    ap.add_argument("script", choices=sorted(BY_NAME))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--mode", choices=("run", "attach", "hooks"), default="run")
    ap.add_argument("--warmup", type=float, default=30.0, help="attach: seconds after start")
    ap.add_argument("--out", type=Path, default=Path("look.json"))
    a = ap.parse_args(argv)
    if a.what == "time":
        res = time_fix(a.script, a.rounds, a.seconds)
    else:
        res = one_look(a.script, a.mode, a.seconds, a.out, a.warmup)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
