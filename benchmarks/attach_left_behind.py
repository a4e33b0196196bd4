"""A job's speed after `gpudiag attach --hooks` was SIGKILLed, against the same job never
attached: the hooks left behind must go quiet (the report's promise: >= 0.99 of bare speed).

Each round starts two fresh jobs side by side: `--job train` (the default), a tiny CPU
training loop (DataLoader over in-memory tensors, a 64->64 linear model, SGD; about 0.3 ms a
step, so a few microseconds of hook work would show), or `--job infer`, forwards of an 8-layer
MLP under no_grad (about 0.1 ms each; what a server's model does). Both jobs time a window of
steps at the same time (the box's other load hits both alike); then one gets
`gpudiag attach PID --hooks`, SIGKILLed 2 s after the hooks said hello; 4 s later (past the
hooks' QUIET_AFTER_S) both time a second window. Times are the main thread's CPU time
(waiting for a core is not the job's cost) in blocks of 5 steps. Per round:

- side by side: bare time / attached time per step in the second window (the median of the
  mean step times of its ten tenths; 1.0: no cost). Two processes of the same script differ by
  a few percent on their own (their memory layout), so this scatters by ±3% a round on a
  2-core box even with nothing attached (`--control`), more with other work on it;
- own before/after: each job's second window against its own first one (the 5th percentile
  of its blocks' step times: blocks no other process broke into), the attached job's change
  over the bare job's. It cancels the two processes' own difference and most of the box's
  other work: over the same rounds it scattered 2-3 times less than side by side on a shared
  2-core box (load 2.4-3.7), with one round far off now and then (the median takes care of
  it). It sees what every step pays, not a cost now and then (side by side does);
- in the hooks: what the global optimizer step hooks left behind take a step, timed directly
  in the job (its hook loop against the bare job's, torch's own), and how many global step and
  forward hooks are left (none: quiet hooks take theirs out; a forward hook, even one
  returning at once, takes every module call off torch's fast path).

The medians over the rounds are the result; odd rounds start the attached job first. Needs gdb
on Python 3.10-3.13.

    python benchmarks/attach_left_behind.py --rounds 9 [--job infer] [--control]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BLOCK = 5  # steps a block (1.5 ms: some run with no other process breaking in)
SETUP = {
    "train": """
from torch.utils.data import DataLoader, TensorDataset
data = DataLoader(TensorDataset(torch.randn(4096, 64), torch.randn(4096, 64)), batch_size=32)
m = torch.nn.Linear(64, 64); opt = torch.optim.SGD(m.parameters(), lr=0.01)
def batches():
    while True:
        yield from data
it = batches()
def step():
    x, y = next(it); opt.zero_grad(); ((m(x) - y) ** 2).mean().backward(); opt.step()
""",
    "infer": """
layers = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(8)]
net = torch.nn.Sequential(*layers); x = torch.randn(32, 64); opt = None
def step():
    with torch.no_grad():
        net(x)
""",
}
STEPS = {"train": 20000, "infer": 60000}  # about 7 s a window each
JOB = """
import json, os, sys, time, torch
torch.set_num_threads(1)
first, go, steps, block = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
{setup}
def window():
    blocks = []
    for _ in range(steps // block):
        t = time.thread_time()
        for _ in range(block):
            step()
        blocks.append((time.thread_time() - t) / block * 1e6)
    return blocks
def until(path):
    while not os.path.exists(path):
        for _ in range(50):
            step()
for _ in range(200):
    step()
print("ready", flush=True)
until(first)
print("before", json.dumps(window()), flush=True)
until(go)
time.sleep(0.2)
for _ in range(200):
    step()
after = window()
h = sys.modules.get("gpudiag_hooks")
state = "quiet" if h and h._state.quiet else "active" if h else "none"
from torch.optim.optimizer import _global_optimizer_post_hooks as post
from torch.nn.modules import module as nn
t = time.thread_time()
for _ in range(100000):
    for hook in list(post.values()):
        hook(opt, (), {{}})
hook_us = (time.thread_time() - t) / 100000 * 1e6
forward = len(nn._global_forward_hooks) + len(nn._global_forward_pre_hooks)
out = {{"blocks": after, "hooks": state, "hook_us": hook_us, "forward_hooks": forward}}
out["step_hooks"] = len(post)
print("after", json.dumps(out), flush=True)
"""


def start(job: str, folder: Path, steps: int) -> subprocess.Popen:
    code = JOB.format(setup=SETUP[job])
    args = [str(folder / "first"), str(folder / "go"), str(steps), str(BLOCK)]
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def read(proc: subprocess.Popen, word: str):
    """The job's next line, `word` and its JSON."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    head, _, data = line.partition(" ")
    if head != word:
        raise SystemExit(f"the job said {line.strip()[:200]!r}, not {word}")
    return json.loads(data)


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


def tenths(blocks: list[float]) -> float:
    """The median of the window's ten tenths' mean step times (the side-by-side measure)."""
    k = max(1, len(blocks) // 10)
    return statistics.median(statistics.fmean(blocks[i * k : (i + 1) * k]) for i in range(10))


def quiet_speed(blocks: list[float]) -> float:
    """The 5th percentile of the blocks' step times: blocks no other process broke into."""
    return sorted(blocks)[len(blocks) // 20]


def one_round(job: str, steps: int, folder: Path, swap: bool, control: bool = False) -> dict:
    """One round's measures; `swap`: the attached job started first; `control`: neither job
    is attached (the harness's own ratio between two identical jobs)."""
    bare, hooked = start(job, folder, steps), start(job, folder, steps)
    if swap:
        bare, hooked = hooked, bare
    (folder / "first").touch()
    bare_before, hooked_before = read(bare, "before"), read(hooked, "before")
    if not control:
        line = attach_and_kill(hooked.pid, folder)
        if "loaded into the running job" not in line:
            raise SystemExit(f"the hooks did not get in: {line or 'no hooks line'}")
    else:
        time.sleep(3.0)  # as long as an attach takes
    time.sleep(4.0)  # past the hooks' QUIET_AFTER_S: the agent is gone
    (folder / "go").touch()
    b, h = read(bare, "after"), read(hooked, "after")
    bare.wait()
    hooked.wait()
    own_bare = quiet_speed(b["blocks"]) / quiet_speed(bare_before)
    own_hooked = quiet_speed(h["blocks"]) / quiet_speed(hooked_before)
    hook_us = max(0.0, h["hook_us"] - b["hook_us"]) if job == "train" else 0.0
    return {
        "bare": tenths(b["blocks"]),
        "after": tenths(h["blocks"]),
        "side": tenths(b["blocks"]) / tenths(h["blocks"]),
        "own": own_bare / own_hooked,
        "hook_us": hook_us,
        "hook_share": hook_us / tenths(h["blocks"]),
        "state": h["hooks"],
        "forward_hooks": h["forward_hooks"],
        "step_hooks": h["step_hooks"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--job", choices=sorted(SETUP), default="train")
    ap.add_argument("--steps", type=int, help="steps a window (default: about 7 s of them)")
    ap.add_argument(
        "--control",
        action="store_true",
        help="attach neither job: the harness's own ratio between two identical jobs",
    )
    args = ap.parse_args()
    steps = args.steps or STEPS[args.job]
    load0 = os.getloadavg()[0]
    rounds = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            r = one_round(args.job, steps, Path(tmp), i % 2 == 1, args.control)
        rounds.append(r)
        print(
            f"round {i + 1}: side by side {r['side']:.3f} (bare {r['bare']:.1f} µs/step, after "
            f"the kill {r['after']:.1f}), own before/after {r['own']:.3f}; hooks left behind: "
            f"{r['state']}, {r['hook_us']:.2f} µs a step in them ({r['hook_share']:.2%}), "
            f"{r['step_hooks']} step and {r['forward_hooks']} forward hooks (load average "
            f"{os.getloadavg()[0]:.2f})",
            flush=True,
        )

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    print(
        f"speed after gpudiag was killed / bare ({args.job}"
        f"{', neither attached' if args.control else ''}), median over {args.rounds} rounds: "
        f"side by side {med('side'):.3f}, own before/after {med('own'):.3f}; in the hooks "
        f"left behind {med('hook_us'):.2f} µs a step ({med('hook_share'):.2%}), "
        f"{max(r['step_hooks'] for r in rounds)} step and "
        f"{max(r['forward_hooks'] for r in rounds)} forward hooks "
        f"(load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end)"
    )


if __name__ == "__main__":
    main()
