"""What the in-job compute sampler reads on each open-world job (tests/workloads/
compute_open_world.py, and broadcast_matmul.py), without the agent: the job's model stepped in
this process with every other step armed (the others bare: the timed step's hooks are held
against them), its records read back as the compute table, and COMP001's first place, reason and
modelled speed-up printed. No timing is reported (a check of the readings, not of speed).

    python benchmarks/open_world_readings.py [CAUSE ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "workloads"))
import broadcast_matmul as bm  # noqa: E402
import compute_open_world as w  # noqa: E402

from gpudiag.analyzers.findings.compute import (  # noqa: E402
    _candidates,
    find,
    fix_arg,
    reasons,
    trial,
)
from gpudiag.analyzers.measures.compute import compute_table  # noqa: E402
from gpudiag.analyzers.model.thresholds import Thresholds  # noqa: E402
from gpudiag.analyzers.timeline.timeline import Timeline  # noqa: E402
from gpudiag.probes.inject import gpudiag_compute as gc  # noqa: E402
from gpudiag.probes.inprocess.compute_rows import compute_samples  # noqa: E402


class _Broadcast:
    """broadcast_matmul.py's job (a script of its own) as compute_open_world's Step: its
    optimizer and one training step."""

    def __init__(self) -> None:
        self.model = bm.Net(False)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(bm.BATCH, bm.DIM)
        self.y = torch.randint(0, bm.CLASSES, (bm.BATCH,))

    def step(self) -> None:
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


class _Context:
    """What COMP001's finder reads: the table, the thresholds, no loading share."""

    class profile:  # noqa: N801 (the context's field)
        @staticmethod
        def share(category: str) -> float:
            return 0.0

    def __init__(self, t: object) -> None:
        self.compute, self.th = t, Thresholds()


def readings(cause: str, steps: int = 14) -> str:
    """One markdown row: the job, COMP001's first place, its reason, its trial and its modelled
    speed-up (from this process's step times: a rough figure, not a measurement)."""
    torch.manual_seed(0)
    job = _Broadcast() if cause == "broadcast_matmul" else w.Step(cause, False)
    sampler = gc.Sampler(torch, [])
    sampler.note_optimizer(job.opt)

    def post(opt: object, args: object, kwargs: object) -> None:
        # every other step armed, the others bare (the timed step's hooks held against them)
        sampler.next_at = 0.0 if sampler.steps % 2 else float("inf")
        sampler.on_step()

    hook = job.opt.register_step_post_hook(post)
    for _ in range(2 * steps):
        job.step()
    hook.remove()
    recs = sampler.take()
    sampler.cancel()
    tl = Timeline()
    for i, rec in enumerate(recs):
        rec["t"] = 1.8e9 + i
        tl.extend(compute_samples({"cmp": [rec]}))
    t = compute_table(tl.whole())
    if t is None:
        return f"| {cause} | no timed step | | | |"
    found = _candidates(t, Thresholds())
    if not found:
        return f"| {cause} | none ({t.model}) | | | |"
    _, row, _, _ = found[0]
    why = "; ".join(r[0] for r in reasons(row, t, Thresholds()))[:150] or "no reason read"
    fix = trial(row)
    tried = f"`{fix_arg(fix)}`" if fix else "-"
    (f,) = find(_Context(t))  # type: ignore[arg-type]
    x = f"x{f.expected_speedup:.2f}" if f.expected_speedup else "-"
    x = f"at most {x}" if f.speedup_kind == "bound" and f.expected_speedup else x
    return f"| {cause} | {row.name} ({row.share:.0%} of the step) | {why} | {tried} | {x} |"


def main() -> None:
    gc.SAMPLE_EVERY_S = 0.0
    torch.set_num_threads(1)
    causes = sys.argv[1:] or [*w.CAUSES, "broadcast_matmul", *w.CONTROLS]
    print(
        "| job | COMP001's place | reason read | trial carried | modelled |\n|---|---|---|---|---|"
    )
    for cause in causes:
        print(readings(cause), flush=True)


if __name__ == "__main__":
    main()
