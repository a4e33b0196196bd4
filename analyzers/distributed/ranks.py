"""A rank of a distributed job as the analyzers see it: its summary (RankStats), the parts
its loop's time is folded into, and the small readers both the decision and the findings use."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudiag.analyzers.model.results import Breakdown, Location

# the per-rank breakdown's parts, from the Breakdown categories
RANK_PARTS: dict[str, tuple[str, ...]] = {
    "data": ("data_wait", "storage_io"),
    "compute": ("forward", "backward", "optimizer", "sync"),
    "copies": ("h2d_copy",),
    "collectives": ("collective",),
    "checkpoint": ("checkpoint",),
    "other": ("gil_wait", "other"),
}
CAUSES = {
    "data": "its input pipeline (DataLoader) is slower",
    "compute": "its own compute is slower (a throttled GPU, a GPU shared with another "
    "process, or more work on this rank)",
    "copies": "its host-to-device copies are slower",
    "checkpoint": "it saves checkpoints the others do not wait for",
    "other": "its own loop work outside forward, backward and the optimizer (Python in the "
    "loop, a transform done on the loop thread, GIL contention)",
}


@dataclass(frozen=True)
class RankStats:
    """One rank's summary: who it is and where its loop's time goes."""

    rank: int
    pid: int | None = None
    host: str | None = None
    gpu: str | None = None
    parts: dict[str, float] = field(default_factory=dict)  # RANK_PARTS shares of its loop
    samples: int = 0  # stack samples behind `parts`
    steps: int | None = None
    step_time_s: float | None = None  # mean, from the hooks
    collective_share_hooks: float | None = None  # time inside collectives / step time (hooks)
    location: str | None = None  # its hottest user frame (file:line:function)
    locations: dict[str, str] = field(default_factory=dict)  # part -> its hottest user frame
    detail: dict[str, float] = field(default_factory=dict)  # Breakdown shares (forward, ...)
    gpu_stats: dict[str, float] = field(default_factory=dict)  # its GPU's means (NVML)
    ddp: bool = False  # its stacks pass through DistributedDataParallel (waits under backward)


DDP_FILE = "torch/nn/parallel/distributed.py"


def uses_ddp(stacks_by_category: dict) -> bool:
    """Whether a rank's loop stacks pass through DistributedDataParallel's forward."""
    return any(
        DDP_FILE in s.stack.replace("\\", "/")
        for group in stacks_by_category.values()
        for s in group
    )


def rank_parts(bd: Breakdown) -> dict[str, float]:
    """A Breakdown folded into the per-rank parts: data, compute, copies, collectives,
    checkpoint, other."""
    return {
        part: round(sum(bd.shares.get(c, 0.0) for c in cats), 6)
        for part, cats in RANK_PARTS.items()
    }


def wait_share(r: RankStats) -> float:
    """Share of the rank's step inside collectives: the stacks, else the hooks."""
    if r.samples:
        return r.parts.get("collectives", 0.0)
    return r.collective_share_hooks or 0.0


def hook_wait(r: RankStats) -> float:
    """Share of the rank's step inside collectives, as the hooks timed it (0: not timed)."""
    return r.collective_share_hooks or 0.0


def label(r: RankStats) -> str:
    """The rank in words: its number, host and GPU."""
    where = f" on {r.host}" if r.host else ""
    gpu = f", GPU {r.gpu}" if r.gpu is not None else ""
    return f"rank {r.rank}{where}{gpu}"


def location(text: str | None) -> Location | None:
    """A file:line:function text as a Location (None when it is not one)."""
    if not text:
        return None
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return Location(parts[0], int(parts[1]), parts[2])
