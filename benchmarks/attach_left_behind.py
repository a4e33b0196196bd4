"""A job's speed after `gpudiag attach --hooks` was SIGKILLed, against the same job never
attached: the hooks left behind must go quiet (the report's promise: >= 0.99 of bare speed).

Each round starts two fresh jobs side by side (a tiny CPU training loop: DataLoader over
in-memory tensors, a 64->64 linear model, SGD; about 0.3 ms a step, so a few microseconds of
hook work would show). One gets `gpudiag attach PID --hooks`, SIGKILLed 2 s after the hooks
said hello; 4 s later both jobs time the same steps at the same time (the box's other load
hits both alike), in the main thread's CPU time (waiting for a core is not the job's cost), in
10 blocks whose median counts. The ratio is bare time / attached time
per step (1.0: no cost), median over the rounds. Needs gdb on Python 3.10-3.13.

    python benchmarks/attach_left_behind.py --rounds 5 --steps 20000
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """
import os, sys, time, torch
torch.set_num_threads(1)
from torch.utils.data import DataLoader, TensorDataset
go, steps = sys.argv[1], int(sys.argv[2])
data = DataLoader(TensorDataset(torch.randn(4096, 64), torch.randn(4096, 64)), batch_size=32)
m = torch.nn.Linear(64, 64); opt = torch.optim.SGD(m.parameters(), lr=0.01)
def batches():
    while True:
        yield from data
it = batches()
def step():
    x, y = next(it); opt.zero_grad(); ((m(x) - y) ** 2).mean().backward(); opt.step()
for _ in range(200):
    step()
print("ready", flush=True)
while not os.path.exists(go):
    for _ in range(50):
        step()
time.sleep(0.2)
for _ in range(200):
    step()
blocks = []
for _ in range(10):
    t = time.thread_time()
    for _ in range(steps // 10):
        step()
    blocks.append((time.thread_time() - t) / (steps // 10) * 1e6)
h = sys.modules.get("gpudiag_hooks")
print("hooks", "quiet" if h and h._state.quiet else "active" if h else "none", flush=True)
from torch.optim.optimizer import _global_optimizer_post_hooks as post
t = time.thread_time()
for _ in range(100000):
    for hook in list(post.values()):
        hook(opt, (), {})
print("hook_us", (time.thread_time() - t) / 100000 * 1e6, flush=True)
print(sorted(blocks)[len(blocks) // 2], flush=True)
"""


def start(go: Path, steps: int) -> subprocess.Popen:
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, str(go), str(steps)], stdout=subprocess.PIPE, text=True
    )
    assert job.stdout is not None and job.stdout.readline().strip() == "ready"
    return job


def attach_and_kill(pid: int, folder: Path) -> str:
    """`gpudiag attach PID --hooks`, SIGKILLed once the hooks are in; its hooks line."""
    err = folder / "attach.err"
    with open(err, "w") as fe:
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpudiag.agent.cli.main", "attach", str(pid), "--hooks"]
            + ["--duration", "60", "--out", str(folder / "r.json")],
            stdout=subprocess.DEVNULL,
            stderr=fe,
        )
    line = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and agent.poll() is None:
        line = next((ln for ln in err.read_text().splitlines() if "hooks:" in ln), "")
        if line:
            time.sleep(2.0)  # the hooks send a while to the live agent
            break
        time.sleep(0.1)
    agent.send_signal(signal.SIGKILL)
    agent.wait()
    return line


def timed(job: subprocess.Popen) -> tuple[float, str]:
    """The job's µs per step and the state of its hooks (none, active, quiet) with the time
    its global optimizer hooks take per step."""
    out, _ = job.communicate(timeout=600)
    lines = out.strip().splitlines()
    hook_us = float(lines[-2].split()[-1])
    return float(lines[-1]), f"{lines[-3].split()[-1]}, {hook_us:.2f} µs a step in its hooks"


def one_round(
    steps: int, folder: Path, swap: bool, control: bool = False
) -> tuple[float, float, str]:
    """(bare µs/step, attached-then-killed µs/step, the state of its hooks); `swap`: the
    attached job started first; `control`: neither job is attached (the harness's own
    difference between two identical jobs side by side)."""
    go = folder / "go"
    bare, hooked = start(go, steps), start(go, steps)
    if swap:
        bare, hooked = hooked, bare
    if not control:
        line = attach_and_kill(hooked.pid, folder)
        if "loaded into the running job" not in line:
            raise SystemExit(f"the hooks did not get in: {line or 'no hooks line'}")
    else:
        time.sleep(3.0)  # as long as an attach takes
    time.sleep(4.0)  # past the hooks' QUIET_AFTER_S: the agent is gone
    go.touch()
    (bare, base), (after, state) = timed(bare), timed(hooked)
    return bare, after, f"{state}; the bare job: {base}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument(
        "--control",
        action="store_true",
        help="attach neither job: the harness's own ratio between two identical jobs",
    )
    args = ap.parse_args()
    ratios = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            bare, after, line = one_round(args.steps, Path(tmp), i % 2 == 1, args.control)
        ratios.append(bare / after)
        print(
            f"round {i + 1}: bare {bare:.1f} µs/step, after the kill {after:.1f} µs/step, "
            f"ratio {bare / after:.3f} (hooks left behind: {line})",
            flush=True,
        )
    load = os.getloadavg()[0]
    print(
        f"speed after gpudiag was killed / bare: median {statistics.median(ratios):.3f} "
        f"over {args.rounds} rounds (load average {load:.2f})"
    )


if __name__ == "__main__":
    main()
