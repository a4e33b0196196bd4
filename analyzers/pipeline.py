"""Input-pipeline findings: DATA001 (add workers), DATA002 (CPU saturated), IO001 (storage)."""

from __future__ import annotations

import math

from gpudiag.analyzers.loop import LoopProfile, location_of
from gpudiag.analyzers.metrics import confidence_above
from gpudiag.analyzers.results import (
    Evidence,
    Finding,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.rules import user_location
from gpudiag.analyzers.thresholds import Thresholds

STACKS = "stacks"


def hot_loader_function(profile: LoopProfile) -> str | None:
    """'function (file:line)' where the loaders spend most of their busy time, user code first."""
    if profile.loader is None:
        return None
    for s in profile.loader.top_stacks:
        fr = user_location(s.stack)
        if fr is not None:
            return f"{fr.function} ({fr.file}:{fr.line})"
    return None


def suggest_workers(wait: float, workers: int, free_cores: float, cpu_count: int
                    ) -> tuple[int, int, float]:
    """(workers needed to hide loading, workers to set given free cores, expected speed-up).

    Model: a step takes S = 1 (normalised). With no workers the loop spends `wait` loading and
    1 - wait computing; with W workers each batch costs the workers W x S of loader time. With
    W' workers the step takes max(compute, loading / W').
    """
    compute = max(1e-3, 1.0 - wait)
    load = wait if workers == 0 else float(workers)
    need = max(workers + 1, math.ceil(load / compute - 1e-9))
    if workers == 0:
        cap = max(1, cpu_count - 1)  # the loop keeps one core; workers take the others
    else:
        cap = min(max(workers + 1, workers + int(math.floor(free_cores))),
                  max(workers + 1, cpu_count))
    suggest = min(need, cap)
    new_step = max(compute, load / suggest)
    return need, suggest, 1.0 / new_step


def _severity(impact: float, th: Thresholds, error_at: float | None = None) -> str:
    return "error" if impact >= (error_at if error_at is not None else th.error_impact) \
        else "warning"


def data_findings(profile: LoopProfile, metrics: dict, th: Thresholds) -> list[Finding]:
    """DATA001 or DATA002 when the loop waits on CPU work in the input pipeline."""
    wait = profile.share("data_wait")
    n = profile.samples
    exact = metrics.get("data_wait_ratio")
    if exact is not None and metrics.get("steps", 0) >= 10:
        # the hooks time every DataLoader wait: use that, minus the storage share the
        # stacks attribute to reads (IO001 reports that part)
        sampled = wait + profile.share("storage_io")
        wait = exact * (wait / sampled) if sampled > 0 else exact
        conf = 0.95 if wait >= th.data_wait_warn else 0.0
        source = "in-process hooks"
    else:
        if n < th.min_loop_samples:
            return []
        conf = confidence_above(wait, th.data_wait_warn, n)
        source = STACKS
    if wait < th.data_wait_warn:
        return []
    if conf < th.min_confidence:
        return []
    cpu_count = int(metrics.get("cpu_count") or 1)
    free = metrics.get("host_free_cores")
    util = metrics.get("host_cpu_util")
    workers = int(round(metrics.get("workers") or 0)) if profile.loader and \
        profile.loader.source == "workers" else 0
    loc = location_of(profile.stacks_by_category.get("data_wait", ()))
    hot = hot_loader_function(profile)
    ev = [Evidence("data_wait_share", round(wait, 4), "ratio", th.data_wait_warn, ">=",
                   "data_wait_warn", source),
          Evidence("dataloader_workers", float(workers), "count", source="procfs")]
    if free is not None:
        ev.append(Evidence("host_free_cores", round(free, 2), "cores", th.min_free_cores,
                           ">=" if free >= th.min_free_cores else "<", "min_free_cores",
                           "procfs"))
    if util is not None:
        ev.append(Evidence("host_cpu_util", round(util, 4), "ratio", source="procfs"))
    sev = _severity(wait, th, th.data_wait_error)
    where = f" Loaders spend most time in {hot}." if hot else ""
    # DATA002 needs workers that already use the cores; with num_workers=0 the loading runs
    # on the loop thread, and moving it to a worker overlaps it with compute whatever the load.
    if workers > 0 and free is not None and free < th.min_free_cores:
        used = (metrics.get("worker_cpu_cores") or 0.0) + (metrics.get("target_cpu_cores") or 0.0)
        msg = (f"The training loop waits for batches {wait:.0%} of the time, but the CPU is "
               f"already saturated: {cpu_count} cores at {util:.0%} busy (the job uses "
               f"{used:.1f} cores, {workers} DataLoader workers), {free:.1f} cores idle. More "
               f"workers would only compete for the same cores.{where}")
        actions = []
        if hot:
            actions.append(f"make the per-sample work cheaper: profile {hot} "
                           "(decode at lower resolution, vectorise, drop redundant copies)")
        actions += [
            "pre-process once and cache the decoded/augmented tensors (e.g. save to .npy or "
            "a WebDataset/LMDB shard) so each epoch only reads them",
            "move augmentation to the GPU (torchvision.transforms.v2 on CUDA tensors, "
            "NVIDIA DALI, torchvision.io.decode_jpeg(device='cuda'))",
        ]
        if workers > cpu_count:
            actions.append(f"num_workers={max(1, cpu_count - 1)}: {workers} workers on "
                           f"{cpu_count} cores oversubscribe the CPU")
        actions.append("or run on a machine with more CPU cores per GPU")
        return [Finding(
            "DATA002", "Input pipeline is CPU-bound and the cores are already busy", sev, conf,
            wait, msg, tuple(ev),
            Recommendation("Make loading cheaper; more workers cannot help here", tuple(actions)),
            speedup_from_impact(wait), loc, signals=("stacks", "procfs"))]
    need, suggest, speedup = suggest_workers(wait, workers, free or 0.0, cpu_count)
    idle = f"{free:.1f} of {cpu_count} CPU cores are idle" if free is not None else \
        "host CPU use was not measured"
    msg = (f"The training loop waits for batches {wait:.0%} of the time "
           f"(num_workers={workers}); {idle}."
           f"{where} Loading needs about {need} worker{'s' if need != 1 else ''} to keep up"
           + (f"; {suggest} fit the idle cores." if suggest < need else "."))
    actions = [f"DataLoader(..., num_workers={suggest})"]
    if suggest < need:
        actions.append(f"{need} workers would hide loading entirely; with more cores "
                       f"(or cheaper transforms) set num_workers={need}")
    actions.append("persistent_workers=True (keep workers alive between epochs)")
    if workers > 0:
        actions.append("prefetch_factor=4 (more batches queued per worker, smooths bursts)")
    return [Finding(
        "DATA001", "Training loop waits on the input pipeline; idle CPU can add workers", sev,
        conf, wait, msg, tuple(ev),
        Recommendation(f"Load batches in parallel: num_workers={suggest}", tuple(actions)),
        min(speedup, speedup_from_impact(wait)), loc, signals=("stacks", "procfs"))]


def io_findings(profile: LoopProfile, metrics: dict, th: Thresholds,
                loader_d_state: float | None) -> list[Finding]:
    """IO001 when the input pipeline's time goes to storage reads, confirmed by I/O stalls."""
    share = profile.share("storage_io")
    n = profile.samples
    if n < th.min_loop_samples or share < th.storage_io_warn or profile.loader is None:
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
    ev = [Evidence("storage_io_share", round(share, 4), "ratio", th.storage_io_warn, ">=",
                   "storage_io_warn", STACKS),
          Evidence("loader_io_fraction", round(profile.loader.io_fraction, 4), "ratio",
                   source=STACKS)]
    crossed = False
    for value, limit, name, setting, src in confirmations:
        if value is None:
            continue
        hit = value >= limit
        crossed |= hit
        ev.append(Evidence(name, round(value, 4), "ratio", limit, ">=" if hit else "<",
                           setting, src))
    if not crossed:
        return []
    read = metrics.get("read_bytes_per_s")
    if read is not None:
        ev.append(Evidence("read_throughput", round(read / 1e6, 2), "MB/s", source="procfs"))
    workers = int(round(metrics.get("workers") or 0)) if profile.loader.source == "workers" \
        else 0
    cpu_wait = profile.share("data_wait")
    suggest = min(4 * int(metrics.get("cpu_count") or 1),
                  max(workers * 2, math.ceil(max(workers, 1) / max(0.05, 1 - share - cpu_wait))))
    loc = location_of(profile.loader.top_stacks) or \
        location_of(profile.stacks_by_category.get("data_wait", ()))
    read_s = f", reading {read / 1e6:.1f} MB/s" if read else ""
    msg = (f"The input pipeline waits on storage: {share:.0%} of the loop's time goes to "
           f"reads ({profile.loader.io_fraction:.0%} of the {profile.loader.source}' busy "
           f"time is in file reads{read_s}). The CPU is not the limit; the disk is.")
    actions = (
        "copy the dataset to local NVMe or RAM (/dev/shm) before training, or keep it in the "
        "page cache (enough free memory for the dataset)",
        "pack small files into large sequential shards (WebDataset tar, LMDB, Parquet) "
        "instead of one file per sample",
        f"DataLoader(..., num_workers={suggest}, prefetch_factor=4): I/O-bound workers sleep "
        "in reads, so more of them than cores overlap the waits",
    )
    return [Finding(
        "IO001", "Input pipeline waits on storage reads", _severity(share, th), conf, share,
        msg, tuple(ev),
        Recommendation("Make reads faster or overlap them: local/cached data, larger files, "
                       "more workers", actions),
        speedup_from_impact(share), loc, signals=("stacks", "procfs", "psi"))]
