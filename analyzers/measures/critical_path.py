"""The critical path: which side the job waits on, joined over the same loop window.

What the GPU did (NVML utilisation, GPM SM activity) meets what the loop thread did (its
stack categories, refined by the in-process hooks' exact waits):

- GPU busy while the host is blocked in a sync: GPU-bound time, no stall.
- GPU idle while the host waits for data, storage, a checkpoint, a copy or the GIL: that
  cause's idle (it is on the critical path).
- GPU idle while the loop thread runs on the CPU in framework or user code: host-bound.
- GPU idle that neither side explains: left for GPU001.

A finding's impact is the GPU idle its cause accounts for; for a job without a GPU signal it
is the share of loop time (there is nothing else to wait on).
"""

from __future__ import annotations

from dataclasses import dataclass

# Host-side waits, in the order they take GPU idle (the clearest causes first).
WAITS = ("checkpoint", "data_wait", "storage_io", "h2d_copy", "gil_wait", "collective")
HOST_WORK = ("forward", "backward", "optimizer", "other")
SYNCS_PER_STEP_MIN = 0.5  # a sync at least every other step drains the GPU's queue


@dataclass(frozen=True)
class CriticalPath:
    """Where the GPU's idle time in the loop window comes from."""

    gpu_idle: float | None  # None: no GPU signal (CPU job or NVML missing)
    idle_by_wait: dict[str, float]  # GPU idle attributed to each host wait
    sync_bubbles: float  # idle in the GPU's queue drained by syncs
    host_bound: float  # idle while the loop thread works on the CPU
    unexplained: float  # idle neither side explains
    signals: tuple[str, ...]

    def caused(self, category: str) -> float:
        """GPU idle a host wait category causes (0 when there is no GPU signal)."""
        return self.idle_by_wait.get(category, 0.0)

    def not_on_waits(self) -> float | None:
        """GPU idle no host wait takes (the loop thread late to launch, or unexplained): what
        a slower loop thread, e.g. one waiting for a CPU, can cost; None without a GPU signal."""
        if self.gpu_idle is None:
            return None
        return self.host_bound + self.sync_bubbles + self.unexplained

    def to_dict(self) -> dict:
        """JSON form used in reports."""
        return {
            "gpu_idle": None if self.gpu_idle is None else round(self.gpu_idle, 4),
            "idle_by_wait": {k: round(v, 4) for k, v in self.idle_by_wait.items() if v},
            "sync_bubbles": round(self.sync_bubbles, 4),
            "host_bound": round(self.host_bound, 4),
            "unexplained": round(self.unexplained, 4),
            "signals": list(self.signals),
        }


def critical_path(
    shares: dict[str, float],
    gpu_idle: float | None,
    syncs_per_step: float | None,
    signals: tuple[str, ...],
    has_stacks: bool = True,
) -> CriticalPath:
    """Attribute the loop window's GPU idle to host waits, sync bubbles and host work.

    Without stack samples of the loop thread, host work cannot be told from a block the
    stacks would show: what the waits do not explain stays unexplained.
    """
    if gpu_idle is None:
        return CriticalPath(None, {}, 0.0, 0.0, 0.0, signals)
    left = max(0.0, gpu_idle)
    by_wait: dict[str, float] = {}
    for c in WAITS:
        take = min(shares.get(c, 0.0), left)
        by_wait[c] = take
        left -= take
    work = sum(shares.get(c, 0.0) for c in HOST_WORK)
    in_sync = shares.get("sync", 0.0)
    bubbles = host = 0.0
    if has_stacks and left > 0 and work > 0 and work >= in_sync:
        host = min(left, work)
        if syncs_per_step is not None and syncs_per_step >= SYNCS_PER_STEP_MIN:
            # without the syncs, host work would overlap the GPU's: the step would take
            # max(host, gpu) instead of host + gpu
            bubbles = min(host, 1.0 - gpu_idle)
            host -= bubbles
        left -= host + bubbles
    return CriticalPath(gpu_idle, by_wait, bubbles, host, max(0.0, left), signals)


def refine_with_hooks(shares: dict[str, float], metrics: dict) -> dict[str, float]:
    """Loop shares with the hooks' exact copy time as its own phase (stacks see a `.to()`
    call as the user line that made it)."""
    h2d = metrics.get("h2d_copy_per_step_s")
    sps = metrics.get("steps_per_second")
    if not h2d or not sps:
        return shares
    exact = min(1.0, h2d * sps)
    gap = exact - shares.get("h2d_copy", 0.0)
    if gap <= 0:
        return shares
    out = dict(shares)
    for c in ("other", "forward", "backward", "optimizer"):
        take = min(gap, out.get(c, 0.0))
        out[c] = out.get(c, 0.0) - take
        gap -= take
        if gap <= 0:
            break
    out["h2d_copy"] = exact - max(0.0, gap)
    return out
