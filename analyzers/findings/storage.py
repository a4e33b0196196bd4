"""IO001: the input pipeline waits on storage reads, confirmed by I/O stalls."""

from __future__ import annotations

import math

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.measures.loop import location_of
from gpudiag.analyzers.measures.summary import confidence_above
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation, speedup_from_impact

IO001 = register(
    Spec(
        "IO001",
        "Input pipeline waits on storage reads",
        "host",
        True,
        time_in="storage_io",
        claims=("loop_time",),
        doc=Doc(
            means="the input pipeline waits on storage (confirmed by D-state, PSI io or iowait)",
            fix="local/RAM copy, larger sequential shards, more I/O workers",
            measured=(
                Measured(
                    impact="GPU idle while the loaders read",
                    speedup="a bound: reads removed",
                ),
            ),
        ),
    )
)


STACKS = "stacks"


def find(c: Context) -> list[Finding]:
    """IO001 when the input pipeline's time goes to storage reads, confirmed by I/O stalls."""
    profile = c.profile
    metrics = c.metrics
    th = c.th
    loader_d_state = c.loader_d
    gpu_idle_caused = c.caused("storage_io")
    share = profile.share("storage_io")
    n = profile.samples
    if n < th.stack_floor_samples or share < th.storage_io_warn or profile.loader is None:
        return []
    conf = confidence_above(share, th.storage_io_warn, n)
    if conf < th.min_confidence:
        return []
    psi = metrics.get("psi_io_some")
    iowait = metrics.get("host_iowait")
    confirmations = [
        (loader_d_state, th.io_dstate_min, "loader_d_state_share", "io_dstate_min", "procfs"),
        (psi, th.psi_io_min, "psi_io_some", "psi_io_min", "psi"),
        (iowait, th.iowait_min, "host_iowait", "iowait_min", "procfs"),
    ]
    ev = [
        th.evidence("storage_io_warn", "storage_io_share", round(share, 4), "ratio", ">=", STACKS),
        Evidence(
            "loader_io_fraction", round(profile.loader.io_fraction, 4), "ratio", source=STACKS
        ),
    ]
    crossed = False
    for value, limit, name, setting, src in confirmations:
        if value is None:
            continue
        hit = value >= limit
        crossed |= hit
        ev.append(
            Evidence(name, round(value, 4), "ratio", limit, ">=" if hit else "<", setting, src)
        )
    if not crossed:
        return []
    impact = share if gpu_idle_caused is None else gpu_idle_caused
    if impact < th.storage_io_warn:
        return []
    read = metrics.get("read_bytes_per_s")
    if read is not None:
        ev.append(Evidence("read_throughput", round(read / 1e6, 2), "MB/s", source="procfs"))
    workers = int(round(metrics.get("workers") or 0)) if profile.loader.source == "workers" else 0
    cpu_wait = profile.share("data_wait")
    suggest = min(
        4 * int(metrics.get("cpu_count") or 1),
        max(workers * 2, math.ceil(max(workers, 1) / max(0.05, 1 - share - cpu_wait))),
    )
    loc = location_of(profile.loader.top_stacks) or location_of(
        profile.stacks_by_category.get("data_wait", ())
    )
    read_s = f", reading {read / 1e6:.1f} MB/s" if read else ""
    msg = (
        f"The input pipeline waits on storage: {share:.0%} of the loop's time goes to "
        f"reads ({profile.loader.io_fraction:.0%} of the {profile.loader.source}' busy "
        f"time is in file reads{read_s}). The CPU is not the limit; the disk is."
    )
    actions = (
        "copy the dataset to local NVMe or RAM (/dev/shm) before training, or keep it in the "
        "page cache (enough free memory for the dataset)",
        "pack small files into large sequential shards (WebDataset tar, LMDB, Parquet) "
        "instead of one file per sample",
        f"DataLoader(..., num_workers={suggest}, prefetch_factor=4): I/O-bound workers sleep "
        "in reads, so more of them than cores overlap the waits",
    )
    return [
        new_finding(
            "IO001",
            th,
            confidence=conf,
            impact=impact,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation(
                "Make reads faster or overlap them: local/cached data, larger files, more workers",
                actions,
            ),
            expected_speedup=speedup_from_impact(share),
            location=loc,
            signals=("stacks", "procfs", "psi"),
            speedup_basis=f"a bound: x{speedup_from_impact(share):.2f} if reads cost nothing "
            "(the storage wait removed)",
            speedup_kind="bound",
        )
    ]


FINDER = Finder("storage", find, (IO001,))
