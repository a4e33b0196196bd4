"""What a timed step's places read against the same step run bare (issue 55, COMP001's model):
one job (tests/workloads/broadcast_matmul.py's, planted or --fixed) stepped in this process,
bare and armed steps alternately; each step cut by outer marks (the forward, the loss and
zero_grad, the backward, the optimizer step), and each armed step's record read back (its step,
the hooks' own time taken out of it, its places). Medians over the steps.

    python benchmarks/timed_step_split.py [--fixed] [--steps 300]

Prints the bare steps' phases, the armed steps' phases, and the armed records: the record's
step against the bare phases' sum says whether the timed step stands for a bare one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "workloads"))
import broadcast_matmul as bm  # noqa: E402

from gpudiag.probes.inject import gpudiag_compute as gc  # noqa: E402

PHASES = ("forward", "loss", "backward", "optimizer")


def ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    gc.SAMPLE_EVERY_S, gc.MAX_RECORDS = 0.0, 10 * a.steps
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = bm.Net(a.fixed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(bm.BATCH, bm.DIM), torch.randint(0, bm.CLASSES, (bm.BATCH,))
    sampler = gc.Sampler(torch, [])
    sampler.note_optimizer(opt)
    arm_next = [False]

    def post(o: object, args: object, kwargs: object) -> None:
        sampler.next_at = 0.0 if arm_next[0] else float("inf")
        sampler.on_step()

    opt.register_step_post_hook(post)
    phases: dict[bool, list[list[float]]] = {False: [], True: []}
    records = []
    pc = time.perf_counter
    for i in range(a.steps):
        armed = sampler.armed is not None
        arm_next[0] = not armed and i > 10  # bare, armed, bare, ... after a warm-up
        t0 = pc()
        out = model(x)
        t1 = pc()
        loss = F.cross_entropy(out, y)
        opt.zero_grad()
        t2 = pc()
        loss.backward()
        t3 = pc()
        opt.step()
        t4 = pc()
        if i <= 20:
            continue
        rec = sampler.records[-1] if armed and sampler.records else None
        if armed and (rec is None or rec["count"]):
            continue  # a counted step: its time is not used
        phases[armed].append([t1 - t0, t2 - t1, t3 - t2, t4 - t3])
        if rec is not None:
            records.append(rec)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"broadcast_matmul{' --fixed' if a.fixed else ''}, load {load}")
    for armed in (False, True):
        cols = list(zip(*phases[armed], strict=True))
        cells = " ".join(f"{n} {ms(list(c)):.3f}" for n, c in zip(PHASES, cols, strict=True))
        print(f"  {'armed' if armed else 'bare '} steps ({len(phases[armed])}): {cells} ms")
    units: dict[str, list[float]] = {}
    for rec in records:
        for name, f, b, _ in rec["units"]:
            units.setdefault(name, []).append(f + b)
    print(
        f"  armed records ({len(records)}): step {ms([r['step'] for r in records]):.3f}, hooks' "
        f"own time {ms([r['hooks'] for r in records]):.3f} (taken out), own code "
        f"{ms([r['own'] + r['own_bwd'] for r in records]):.3f}, optimizer "
        f"{ms([r['opt'] for r in records]):.3f}, "
        + ", ".join(f"{n} {ms(v):.3f}" for n, v in units.items())
        + " ms"
    )


if __name__ == "__main__":
    main()
