"""SYNC001: host-device synchronisation in the loop, from the in-process hooks (CUDA)."""

from __future__ import annotations

from dataclasses import replace

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.findings.evaluation import eval_time
from gpudiag.analyzers.measures.critical_path import CriticalPath
from gpudiag.analyzers.measures.throughput import sync_sites
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Location,
    Recommendation,
    speedup_from_impact,
)

SYNC001 = register(
    Spec(
        "SYNC001",
        "Host-device syncs in the loop leave the GPU idle",
        "host",
        True,
        time_in="sync",
        claims=("loop_time",),
        reads=("eval_pass",),
        doc=Doc(
            means=(
                "syncs (`.item()`, `.cpu()`, `synchronize`) drain the GPU's queue and it idles "
                "after each (needs a GPU signal: time blocked in a sync while the GPU computes is"
                " not a stall)"
            ),
            fix="call sites; sum on the GPU, log every N steps",
            measured=(
                Measured(
                    impact="the GPU idle after syncs",
                    speedup=(
                        "host work overlapping GPU work: the step takes max(host, GPU) instead of"
                        " their sum"
                    ),
                ),
            ),
        ),
    )
)


def find(c: Context) -> list[Finding]:
    """SYNC001 with syncs per step, the GPU idle they cause and their call sites; the syncs
    an evaluation pass makes are left to EVAL001 (one cause, one id: nanoGPT's estimate_loss
    calls .item() 400 times a pass).

    Time the host spends blocked in a sync while the GPU computes is the GPU's own work. What
    a sync costs is the bubble after it: the GPU's queue is empty and it idles while the host
    prepares the next launches. The critical path measures that bubble; without a GPU signal
    the finding is not made (it cannot tell work from stall).
    """
    metrics, th = c.metrics, c.th
    ratio = metrics.get("sync_time_ratio")
    per_step = metrics.get("syncs_per_step")
    if ratio is None or per_step is None or per_step <= 0:
        return []
    sites, cp = _own_syncs(c)
    if cp.gpu_idle is None:
        return []
    impact = cp.sync_bubbles
    if impact < th.sync_warn:
        return []
    ev = [
        th.evidence(
            "sync_warn",
            "sync_gpu_idle",
            round(impact, 4),
            "ratio",
            ">=",
            "critical path (nvml + hooks)",
        ),
        Evidence("sync_time_ratio", round(ratio, 4), "ratio", source="in-process hooks"),
        Evidence("syncs_per_step", round(per_step, 2), "count", source="in-process hooks"),
    ]
    loc, where, at = _at_sites(sites)
    ev += at
    msg = (
        f"The loop blocks on the GPU {per_step:.1f} times per step (.item(), .cpu(), "
        f".tolist(), synchronize): each sync empties the GPU's queue, and the GPU then "
        f"idles while the host prepares the next launches, {impact:.0%} of the loop."
        f"{where}"
    )
    actions = (
        "keep running sums on the GPU (total += loss.detach()) and call .item() every "
        "N steps (e.g. 50) for logging",
        "replace data-dependent shapes (.nonzero(), boolean masks) with masked arithmetic",
        "copy results with .to('cpu', non_blocking=True) into pinned "
        "buffers and read them a step later",
    )
    idle = cp.gpu_idle or 0.0
    speed = speedup_from_impact(impact)
    return [
        new_finding(
            "SYNC001",
            th,
            confidence=0.9,
            impact=impact,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation("Sync less: log every N steps", actions),
            expected_speedup=speed,
            location=loc,
            signals=("in-process hooks", "nvml utilization"),
            speedup_basis=f"host work overlapping the GPU's instead of following it: "
            f"the step takes max(host, GPU) instead of their sum "
            f"(GPU idle {idle:.0%} now)",
        )
    ]


def _at_sites(sites: list[tuple[str, float]]) -> tuple[Location | None, str, list[Evidence]]:
    """The top sync site as a location, the sentence naming the top three, their evidence."""
    if not sites:
        return None, "", []
    file, line, func, _call = (sites[0][0].rsplit(":", 3) + ["", "", ""])[:4]
    loc = Location(file, int(line), func) if line.isdigit() else None
    where = " Most at " + "; ".join(s for s, _ in sites[:3]) + "."
    ev = [
        Evidence(f"sync_site[{site}]", n, "count (1 in 16 sampled)", source="in-process hooks")
        for site, n in sites[:3]
    ]
    return loc, where, ev


def _own_syncs(c: Context) -> tuple[list[tuple[str, float]], CriticalPath]:
    """The loop's sync sites and critical path, less the syncs of an evaluation pass that
    EVAL001 claims (its sites dropped, its share of the sync bubbles taken out)."""
    sites = sync_sites(c.view)
    if not c.claimed("eval_pass") or not sites:
        return sites, c.cp
    et = eval_time(c.view, c.profile, c.clf)
    if et is None:
        return sites, c.cp
    own = [(site, n) for site, n in sites if _function(site) != et.function]
    kept = sum(n for _, n in own) / sum(n for _, n in sites)
    return own, replace(c.cp, sync_bubbles=c.cp.sync_bubbles * kept)


def _function(site: str) -> str:
    """The function of a sync site 'file:line:function:call'."""
    parts = site.rsplit(":", 3)
    return parts[2] if len(parts) == 4 else ""


FINDER = Finder("sync", find, (SYNC001,))
