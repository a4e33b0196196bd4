"""What `gpudiag attach --hooks` costs a job while it looks, against plain `gpudiag attach`.

Each round starts two identical jobs side by side (benchmarks/attach_left_behind.py's tiny
CPU training loop, about 0.3 ms a step, so a few microseconds of hook work would show; or its
`--job infer` forward loop). Both time a window of steps with nothing attached; then one gets
`gpudiag attach PID` and the other `gpudiag attach PID --hooks`, started together, and once
the hooks said hello both time a second window while the two looks go on. Times are the
main thread's CPU time in blocks of 5 steps (waiting for a core is not the job's cost). Per
round, the plain-attached job's second window over its first, divided by the hooked job's
(own before/after: 1.0 = the hooks cost nothing; below 1, the hooks' share), and the same
two windows side by side. The hooks' loading itself stops the job's main thread once: the
helper's measured stop (attach to detach) is printed apart, from loads of an empty script
into a third job of the same kind after the windows. On Python 3.10-3.13 the hooks get in by
pyinjector where it is installed (gdb otherwise).

    python benchmarks/attach_hooks_cost.py --rounds 5 [--job infer]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attach_left_behind import SETUP, STEPS, quiet_speed, read, start, tenths  # noqa: E402

from gpudiag.probes.inprocess import injector  # noqa: E402

LOOK_S = 150  # each look's --duration: longer than the wait for the hooks and the window
LOADS = 5  # hooks loads timed into the bare job after the windows


def look(pid: int, folder: Path, hooks: bool) -> tuple[subprocess.Popen, Path]:
    """`gpudiag attach PID [--hooks]`, its stderr kept in a file."""
    err = folder / f"attach-{pid}.err"
    argv = [sys.executable, "-m", "gpudiag.agent.cli.main", "attach", str(pid)]
    argv += ["--hooks"] if hooks else []
    argv += ["--duration", str(LOOK_S), "--out", str(folder / f"r-{pid}.json")]
    with open(err, "w") as fe:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fe)
    return proc, err


def wait_for(err: Path, word: str, agent: subprocess.Popen, limit_s: float = 90) -> str:
    """The first line of the look's stderr that holds `word` (empty past the limit)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and agent.poll() is None:
        line = next((ln for ln in err.read_text().splitlines() if word in ln), "")
        if line:
            return line
        time.sleep(0.1)
    return ""


def stops_ms(job: str, folder: Path) -> list[float]:
    """How long each of LOADS loads of an empty script stopped a third job's main thread."""
    (folder / "stops").mkdir()
    proc = start(job, folder / "stops", 10**9)
    out = []
    try:
        for _ in range(LOADS):
            done, said = injector.inject(proc.pid, "pass\n")
            m = re.search(r"stopped ([\d.]+) ms", said) if done else None
            if m:
                out.append(float(m.group(1)))
    finally:
        proc.kill()
        proc.wait()
    return out


def one_round(job: str, steps: int, folder: Path, swap: bool) -> dict:
    plain, hooked = start(job, folder, steps), start(job, folder, steps)
    if swap:
        plain, hooked = hooked, plain
    (folder / "first").touch()
    plain_before, hooked_before = read(plain, "before"), read(hooked, "before")
    agents = [look(plain.pid, folder, False), look(hooked.pid, folder, True)]
    try:
        line = wait_for(agents[1][1], "hooks:", agents[1][0])
        if "loaded into the running job" not in line:
            raise SystemExit(f"the hooks did not get in: {line or 'no hooks line'}")
        wait_for(agents[0][1], "attached to pid", agents[0][0])
        time.sleep(1.0)  # both looks sampling
        (folder / "go").touch()
        p, h = read(plain, "after"), read(hooked, "after")
        alive = all(a.poll() is None for a, _ in agents)  # the looks lasted the whole window
    finally:
        for agent, _ in agents:
            agent.kill()
            agent.wait()
    for proc in (plain, hooked):
        proc.wait()
    stops = stops_ms(job, folder)
    own_plain = quiet_speed(p["blocks"]) / quiet_speed(plain_before)
    own_hooked = quiet_speed(h["blocks"]) / quiet_speed(hooked_before)
    return {
        "own": own_plain / own_hooked,
        "side": tenths(p["blocks"]) / tenths(h["blocks"]),
        "plain_us": tenths(p["blocks"]),
        "hooked_us": tenths(h["blocks"]),
        "how": line.split("hooks: ", 1)[-1],
        "alive": alive,
        "stops": stops,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--job", choices=sorted(SETUP), default="train")
    ap.add_argument("--steps", type=int, help="steps a window (default: about 7 s of them)")
    args = ap.parse_args()
    steps = args.steps or STEPS[args.job]
    load0 = os.getloadavg()[0]
    rounds = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            r = one_round(args.job, steps, Path(tmp), i % 2 == 1)
        rounds.append(r)
        print(
            f"round {i + 1}: plain attach / attach --hooks, own before/after {r['own']:.3f}, "
            f"side by side {r['side']:.3f} ({r['plain_us']:.1f} against {r['hooked_us']:.1f} "
            f"µs/step); looks alive through the window: {r['alive']}; hooks {r['how']}; "
            f"loads stopped the main thread {', '.join(f'{x:.1f}' for x in r['stops'])} ms "
            f"(load average {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    stops = [x for r in rounds for x in r["stops"]]
    print(
        f"job speed under attach --hooks / under plain attach ({args.job}), median over "
        f"{args.rounds} rounds: own before/after {statistics.median(r['own'] for r in rounds):.3f}"
        f", side by side {statistics.median(r['side'] for r in rounds):.3f}; one load stops "
        f"the main thread {statistics.median(stops):.1f} ms (median of {len(stops)}, max "
        f"{max(stops):.1f}) (load average {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end)"
    )


if __name__ == "__main__":
    main()
