"""SYNC001: host-device synchronisation in the loop, from the in-process hooks (CUDA)."""

from __future__ import annotations

from gpudiag.analyzers.results import (
    Evidence,
    Finding,
    Location,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.thresholds import Thresholds


def sync_findings(metrics: dict, sites: list[tuple[str, float]], th: Thresholds
                  ) -> list[Finding]:
    """SYNC001 with syncs per step, the time they cost and their call sites."""
    ratio = metrics.get("sync_time_ratio")
    per_step = metrics.get("syncs_per_step")
    if ratio is None or per_step is None or ratio < th.sync_warn or per_step <= 0:
        return []
    ev = [Evidence("sync_time_ratio", round(ratio, 4), "ratio", th.sync_warn, ">=",
                   "sync_warn", "in-process hooks"),
          Evidence("syncs_per_step", round(per_step, 2), "count", source="in-process hooks")]
    loc = None
    where = ""
    if sites:
        file, line, func, call = (sites[0][0].rsplit(":", 3) + ["", "", ""])[:4]
        if line.isdigit():
            loc = Location(file, int(line), func)
        where = " Most at " + "; ".join(s for s, _ in sites[:3]) + "."
        for site, n in sites[:3]:
            ev.append(Evidence(f"sync_site[{site}]", n, "count (1 in 16 sampled)",
                               source="in-process hooks"))
    msg = (f"The training loop blocks on the GPU {per_step:.1f} times per step (.item(), "
           f".cpu(), .tolist(), synchronize), {ratio:.0%} of its time: each sync empties the "
           f"GPU's queue of work, so the GPU then waits for the next launches.{where}")
    actions = ("keep running sums on the GPU (total += loss.detach()) and call .item() every "
               "N steps (e.g. 50) for logging",
               "replace data-dependent shapes (.nonzero(), boolean masks) with masked "
               "arithmetic", "copy results with .to('cpu', non_blocking=True) into pinned "
               "buffers and read them a step later")
    return [Finding("SYNC001", "Host-device syncs in the loop stall the GPU pipeline",
                    "error" if ratio >= th.error_impact else "warning", 0.95, ratio, msg,
                    tuple(ev), Recommendation("Sync less: log every N steps", actions),
                    speedup_from_impact(ratio), loc, signals=("in-process hooks",))]
