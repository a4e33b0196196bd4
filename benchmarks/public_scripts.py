"""Public training scripts nobody here wrote: is gpudiag's verdict right and stable?

For each script under tests/public/ (trimmed copies of public examples, see its README):

1. `gpudiag run` and `gpudiag attach` on it, --looks times each (JSON reports kept in
   --reports-dir): the top finding (the report's verdict), whether it is sure, the predicted
   speed-up;
2. the job timed bare (A) and with the script's fix flag (B) in interleaved rounds
   (A B B A A B B A ...): steps per second, median and spread;
3. the truth: the fix's finding when it moves the job by >= 15%, else none (a job no fix
   moves must get no warning); a verdict is right when its top id is the truth, stable when
   every look in a mode gave the same id.

    python benchmarks/public_scripts.py [--scripts mnist,hf_trainer] [--json out.json]

Progress on stderr, a markdown table on stdout. --timing-from FILE reuses the measured truth
of an earlier --json (the jobs did not change; only the analyzers did); a script whose
timing failed there is timed again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / "tests" / "public"
MOVES = 1.15  # a fix that moves the job by at least this is the cause
NOISY = 0.30  # rounds spread wider than this (max-min over median) decide nothing


@dataclass(frozen=True)
class Script:
    """One public script: how to run it, and the flag that applies a fix gpudiag may name."""

    name: str
    path: str
    fix: tuple[str, ...]
    fix_id: str  # the finding whose fix the flag applies
    source: str


SCRIPTS = (
    Script("mnist", "mnist/main.py", ("--workers", "1"), "DATA001", "pytorch/examples mnist"),
    Script("dcgan", "dcgan/main.py", ("--no-checkpoint",), "CKPT001", "pytorch/examples dcgan"),
    Script(
        "word_language_model",
        "word_language_model/main.py",
        ("--no-checkpoint",),
        "CKPT001",
        "pytorch/examples word_language_model",
    ),
    Script("nanogpt", "nanogpt/train.py", ("--no-checkpoint",), "CKPT001", "karpathy/nanoGPT"),
    Script(
        "lightning_ckpt",
        "lightning_ckpt/main.py",
        ("--ckpt-every", "0"),
        "CKPT001",
        "Lightning ModelCheckpoint(every_n_train_steps=5)",
    ),
    Script(
        "hf_trainer",
        "hf_trainer/main.py",
        # the fix DATA001 names on a 2-core box (no idle cores: make loading cheaper), as
        # run_glue.py does it; `--workers 2` measured x0.98 here (2026-11-24)
        ("--pretokenize",),
        "DATA001",
        "transformers Trainer, on-the-fly tokenisation",
    ),
    Script(
        "trl_sft",
        "trl_sft/main.py",
        # the script's own flag: SFTConfig's default (True) that its README command keeps
        ("--gradient_checkpointing", "False"),
        "COMP001",
        "TRL 1.16.0 trl/scripts/sft.py, its README command",
    ),
    Script(
        "st_sts",
        "st_sts/main.py",
        ("--eval-steps", "0"),
        "EVAL001",
        "sentence-transformers training_stsbenchmark.py",
    ),
    Script(
        "run_glue",
        "run_glue/main.py",
        # the script's own flag: run_glue.py pads every row to max_seq_length by default
        ("--pad_to_max_length", "False"),
        "INFER003",
        "transformers run_glue.py, its README command (own data in a csv)",
    ),
)
BY_NAME = {s.name: s for s in SCRIPTS}
STEPS = re.compile(r"steps: (\d+) in ([0-9.]+) s")


def log(msg: str) -> None:
    """One progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def job_cmd(s: Script, fixed: bool = False) -> list[str]:
    """The command line of the script (with its fix flag when `fixed`)."""
    return [sys.executable, str(PUBLIC / s.path), *(s.fix if fixed else ())]


def job_env(seconds: float) -> dict[str, str]:
    """The job's environment: PUBLIC_SECONDS bounds its training."""
    return {**os.environ, "PUBLIC_SECONDS": str(seconds), "PYTHONUNBUFFERED": "1"}


def rate_of(output: str) -> float | None:
    """Steps per second from a script's `steps: N in S s` line (None when absent)."""
    m = STEPS.findall(output)
    if not m:
        return None
    n, secs = int(m[-1][0]), float(m[-1][1])
    return n / secs if n > 0 and secs > 0 else None


def order(rounds: int) -> list[bool]:
    """Interleaved timing order, False = bare (A), True = fixed (B): A B B A A B B A ..."""
    return [b for i in range(rounds) for b in ((False, True) if i % 2 == 0 else (True, False))]


def spread(xs: list[float]) -> float:
    """(max - min) / median: the relative spread of the rounds."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else 0.0


def decided(bare: list[float], fixed: list[float]) -> bool:
    """Whether the timing can say the truth: both sides' rounds within NOISY of their median
    (on a box at load 10 on 2 cores they spread by 100-900% and a no-op fix 'measured' x2)."""
    return bool(bare and fixed) and max(spread(bare), spread(fixed)) <= NOISY


def time_fix(s: Script, rounds: int, seconds: float) -> dict:
    """Steps/s bare and fixed over interleaved rounds; the measured speed-up and the truth."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    for fixed in order(rounds):
        try:
            res = subprocess.run(
                job_cmd(s, fixed),
                env=job_env(seconds),
                capture_output=True,
                text=True,
                timeout=seconds + 120,
            )
            r = rate_of(res.stdout)
        except subprocess.TimeoutExpired:  # a round lost to a very busy box, not the benchmark
            r = None
        log(f"{s.name}: {'fixed' if fixed else 'bare '} {r and round(r, 2)} steps/s")
        if r is not None:
            rates[fixed].append(r)
    if not rates[False] or not rates[True]:
        return {"error": "the job printed no step count", "rates": rates}
    speedup = statistics.median(rates[True]) / statistics.median(rates[False])
    return {
        "bare_steps_s": rates[False],
        "fixed_steps_s": rates[True],
        "bare_spread": round(spread(rates[False]), 3),
        "fixed_spread": round(spread(rates[True]), 3),
        "speedup": round(speedup, 3),
        "decided": decided(rates[False], rates[True]),
        "truth": s.fix_id if speedup >= MOVES else None,
    }


def verdict_of(report: dict) -> dict:
    """Top finding, sureness, predicted speed-up and the serious ids of one report."""
    v = report.get("verdict") or {}
    top = v.get("finding")
    f = next((f for f in report.get("findings", []) if f["id"] == top), None)
    return {
        "top": top,
        "sure": v.get("sure"),
        "predicted": f and f.get("expected_speedup"),
        "serious": [x["id"] for x in report.get("findings", []) if x["severity"] != "note"],
        "loop_samples": (report.get("breakdown") or {}).get("samples"),
        "statement": v.get("statement"),
    }


def _stop(pid: int | None) -> None:
    """End a job started here (SIGTERM, then SIGKILL) and wait until it is gone."""
    if not pid:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def look(s: Script, mode: str, out: Path, seconds: float) -> dict:
    """One `gpudiag run` or `gpudiag attach` of the bare script; its report's verdict."""
    cli = [sys.executable, "-m", "gpudiag.agent.cli.main"]
    job = None
    if mode == "run":
        cmd = [*cli, "run", "-q", "--duration", str(seconds), "--out", str(out), "--"]
        # output to a file, not a pipe: the job outlives gpudiag's look and keeps a pipe open
        with tempfile.TemporaryFile("w+") as f:
            res = subprocess.run(
                cmd + job_cmd(s),
                env=job_env(seconds + 30),
                stdout=f,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=seconds + 180,
            )
            f.seek(0)
            res.stderr = f.read()[-2000:]
    else:
        job = subprocess.Popen(
            job_cmd(s),
            env=job_env(seconds + 40),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(6)  # past the imports: attach to a job that trains
        cmd = [*cli, "attach", str(job.pid), "-q", "--duration", str(seconds), "--out", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180)
    try:
        if res.returncode != 0 or not out.exists():
            return {"error": (res.stderr or res.stdout).strip()[-300:], "report": str(out)}
        report = json.loads(out.read_text())
        _stop(report.get("run", {}).get("pid") if mode == "run" else None)
        return {**verdict_of(report), "report": str(out)}
    finally:
        if job is not None:
            _stop(job.pid)
            job.wait()


def judge(looks: list[dict], truth: str | None, known: bool = True) -> dict:
    """Right (every look's top id is the truth; None when the timing decided nothing) and
    stable (one id across the looks)."""
    tops = [lk.get("top") for lk in looks if "error" not in lk]
    right = bool(tops) and len(tops) == len(looks) and all(t == truth for t in tops)
    return {
        "right": right if known else None,
        "stable": bool(tops) and len(set(tops)) == 1,
        "right_n": sum(t == truth for t in tops),
        "n": len(looks),
    }


def bench_script(s: Script, a: argparse.Namespace, timing: dict | None, reports: Path) -> dict:
    """Looks in both modes and (unless reused) the timing of the fix, for one script."""
    row: dict = {"script": s.name, "source": s.source, "fix": " ".join(s.fix)}
    row["load_before"] = os.getloadavg()[0]
    for mode, secs in (("run", a.run_s), ("attach", a.attach_s)):
        row[mode] = []
        for i in range(a.looks):
            lk = look(s, mode, reports / f"{s.name}-{mode}-{i + 1}.json", secs)
            log(f"{s.name}: {mode} {i + 1}/{a.looks}: {lk.get('top')} sure={lk.get('sure')}")
            row[mode].append(lk)
    row["timing"] = timing or time_fix(s, a.rounds, a.time_s)
    row["load_after"] = os.getloadavg()[0]
    truth, known = row["timing"].get("truth"), row["timing"].get("decided", False)
    for mode in ("run", "attach"):
        row[f"{mode}_judged"] = judge(row[mode], truth, known)
    return row


def _cell(looks: list[dict]) -> str:
    parts = []
    for lk in looks:
        if "error" in lk:
            parts.append("error")
            continue
        sure = "" if lk.get("sure") else " (not sure)"
        pred = f" x{lk['predicted']:.2f}" if lk.get("predicted") else ""
        parts.append(f"{lk.get('top') or 'none'}{pred}{sure}")
    return ", ".join(parts)


def truth_cell(t: dict) -> str:
    """The truth, or why there is none."""
    if not t.get("decided", False):
        return "undecided (noisy)" if "speedup" in t else "not timed"
    return t.get("truth") or "none"


def table(rows: list[dict]) -> str:
    """The markdown table: verdict per mode and look, predicted vs measured."""
    head = (
        "| script | fix timed | measured (median bare -> fixed steps/s, spread) | truth "
        "| `run` | `attach` | right | stable | load |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        t = r["timing"]
        if "speedup" in t:
            meas = (
                f"x{t['speedup']:.2f} ({statistics.median(t['bare_steps_s']):.2f} -> "
                f"{statistics.median(t['fixed_steps_s']):.2f}, ±{t['bare_spread']:.0%}/"
                f"±{t['fixed_spread']:.0%}, n={len(t['bare_steps_s'])}+{len(t['fixed_steps_s'])})"
            )
        else:
            meas = t.get("error", "?")
        rj, aj = r["run_judged"], r["attach_judged"]
        right = f"{rj['right_n']}/{rj['n']} + {aj['right_n']}/{aj['n']}"
        if not t.get("decided", False):
            right = "no truth"
        lines.append(
            f"| {r['script']} | `{r['fix']}` | {meas} | {truth_cell(t)} "
            f"| {_cell(r['run'])} | {_cell(r['attach'])} "
            f"| {right} "
            f"| {'yes' if rj['stable'] and aj['stable'] else 'no'} "
            f"| {r['load_before']:.1f}-{r['load_after']:.1f} |"
        )
    return head + "\n".join(lines) + "\n"


def _git(*args: str) -> str:
    """One git answer about the checkout under test ('' when git cannot say)."""
    res = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return res.stdout.strip()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (bad input: one line, exit 2)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scripts", default=",".join(BY_NAME), help="comma-separated names")
    ap.add_argument("--looks", type=int, default=2, help="looks per mode (default 2)")
    ap.add_argument("--run-s", type=float, default=25.0, help="`run` look, seconds")
    ap.add_argument("--attach-s", type=float, default=20.0, help="`attach` look, seconds")
    ap.add_argument("--rounds", type=int, default=4, help="timing rounds of A and B each")
    ap.add_argument("--time-s", type=float, default=10.0, help="seconds per timed job")
    ap.add_argument("--timing-from", help="reuse the timings of an earlier --json")
    ap.add_argument("--reports-dir", help="where the reports go (default: a new temp dir)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--table-from", help="only print the table of an earlier --json")
    a = ap.parse_args(argv)
    names = [n for n in a.scripts.split(",") if n]
    bad = [n for n in names if n not in BY_NAME]
    if bad or not names:
        ap.exit(2, f"public_scripts: unknown script {bad or a.scripts!r}; known: {list(BY_NAME)}\n")
    for k in ("looks", "rounds", "run_s", "attach_s", "time_s"):
        if not getattr(a, k) > 0:
            ap.exit(2, f"public_scripts: --{k.replace('_', '-')} must be above 0\n")
    a.names = names
    return a


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; write --json."""
    a = parse(argv)
    if a.table_from:
        try:
            print(table(json.loads(Path(a.table_from).read_text())["rows"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"public_scripts: cannot read --table-from: {e}", file=sys.stderr)
            return 2
        return 0
    timings: dict = {}
    if a.timing_from:
        try:
            rows = json.loads(Path(a.timing_from).read_text())["rows"]
            # a timing that failed (no step count) is measured again
            timings = {r["script"]: r["timing"] for r in rows if "speedup" in r["timing"]}
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"public_scripts: cannot read --timing-from: {e}", file=sys.stderr)
            return 2
    reports = Path(a.reports_dir or tempfile.mkdtemp(prefix="public-scripts-"))
    reports.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows = []
    for name in a.names:
        log(f"{name}: start (load {os.getloadavg()[0]:.2f})")
        rows.append(bench_script(BY_NAME[name], a, timings.get(name), reports))
    doc = {
        "started": started,
        "machine": f"{platform.node()} {os.cpu_count()} CPUs {platform.platform()}",
        "command": " ".join(
            [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
        ),
        "reports_dir": str(reports),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
        "rows": rows,
    }
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
