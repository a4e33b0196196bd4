"""GPU findings from NVML samples: idle GPU, launch-bound, no tensor cores, PCIe-bound,
VRAM headroom or pressure, throttling, uneven GPUs.

Each finding says which signal it rests on. NVML "utilisation" only says that some kernel
was running; findings resting on it alone get a lower confidence than those that GPM SM
activity or the host-side stacks confirm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpudiag.analyzers.catalogue import explains_gpu_idle, severity, spec
from gpudiag.analyzers.critical_path import CriticalPath
from gpudiag.analyzers.prices import MODELS, identify
from gpudiag.analyzers.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.thresholds import Thresholds
from gpudiag.analyzers.timeline import Aggregate

NVML_ONLY_CONFIDENCE = 0.6
CONFIRMED_CONFIDENCE = 0.9
GIB = 2 ** 30
# PCIe payload bandwidth per lane and direction, GB/s, by generation.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass
class GpuStats:
    """What one of the job's GPUs did over the run."""

    index: str
    name: str
    samples: int = 0
    busy: float | None = None            # NVML utilisation, mean
    job_sm: float | None = None          # per-process SM utilisation of the job, mean
    sm_active: float | None = None       # GPM
    tensor_active: float | None = None   # GPM
    mem_peak: float | None = None
    mem_total: float | None = None
    pcie_rx: float | None = None
    pcie_tx: float | None = None
    pcie_gen: float | None = None
    pcie_gen_max: float | None = None
    pcie_width: float | None = None
    pcie_width_max: float | None = None
    sm_clock: float | None = None
    sm_clock_max: float | None = None
    gpm_pcie_rx: float | None = None     # bytes/s, GPM (Hopper+)
    power_w: float | None = None
    power_limit: float | None = None
    power_default: float | None = None
    throttle: dict[str, float] = field(default_factory=dict)
    lost: bool = False
    job_uses_gpu: bool = True

    @property
    def idle(self) -> float | None:
        """Share of time no kernel of anyone ran (1 - NVML utilisation)."""
        return None if self.busy is None else max(0.0, 1.0 - self.busy)

    @property
    def rx(self) -> float:
        """Host-to-device bytes/s: GPM's counter where there is one, else NVML's."""
        return self.gpm_pcie_rx if self.gpm_pcie_rx is not None else (self.pcie_rx or 0.0)

    def link_capacity(self) -> float | None:
        """Current PCIe link's payload bandwidth per direction, bytes/s."""
        if not self.pcie_gen or not self.pcie_width:
            return None
        return PCIE_LANE_GBPS.get(int(self.pcie_gen), 0.0) * self.pcie_width * 1e9


def gpu_stats(tl: Aggregate) -> list[GpuStats]:
    """Per-GPU statistics from the timeline's 'gpu' series."""
    out: dict[str, GpuStats] = {}
    job_mem: dict[str, float] = {}
    for (probe, name, lk), roll in tl.series.items():
        if probe != "gpu":
            continue
        labels = dict(lk)
        st = out.setdefault(labels.get("gpu", "?"), GpuStats(labels.get("gpu", "?"),
                                                             labels.get("name", "GPU")))
        mean, peak = roll.mean, roll.maximum
        if name == "util_gpu":
            st.busy, st.samples = mean, roll.count
        elif name == "job_sm_util":
            st.job_sm = mean
        elif name == "gpm_sm_active":
            st.sm_active = mean
        elif name == "gpm_tensor_active":
            st.tensor_active = mean
        elif name == "mem_used_bytes":
            st.mem_peak = peak if st.mem_peak is None else st.mem_peak
        elif name == "job_mem_bytes":
            job_mem[st.index] = peak
        elif name == "mem_total_bytes":
            st.mem_total = peak
        elif name == "pcie_rx_bytes_per_s":
            st.pcie_rx = mean
        elif name == "pcie_tx_bytes_per_s":
            st.pcie_tx = mean
        elif name in ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"):
            setattr(st, name, roll.minimum if name in ("pcie_gen", "pcie_width") else peak)
        elif name == "gpm_pcie_rx_mib_s":
            st.gpm_pcie_rx = mean * 1048576.0 if mean is not None else None
        elif name == "power_w":
            st.power_w = mean
        elif name == "power_limit_w":
            st.power_limit = roll.minimum
        elif name == "power_default_limit_w":
            st.power_default = peak
        elif name == "sm_clock_mhz":
            st.sm_clock = mean
        elif name == "sm_clock_max_mhz":
            st.sm_clock_max = peak
        elif name.startswith("throttle_"):
            st.throttle[name[len("throttle_"):]] = mean or 0.0
        elif name == "lost" and peak and peak > 0:
            st.lost = True
        elif name == "job_uses_gpu":
            st.job_uses_gpu = bool(peak)
    # the job's own memory is what matters; the device's used memory is the fallback
    for index, peak in job_mem.items():
        out[index].mem_peak = peak
    return [out[k] for k in sorted(out, key=lambda x: (len(x), x))]


def _conf(st: GpuStats, base: float = NVML_ONLY_CONFIDENCE) -> float:
    return CONFIRMED_CONFIDENCE if st.sm_active is not None else base


def _gpu_ev(st: GpuStats, name: str, value: float | None, unit: str, **kw) -> Evidence:
    return Evidence(f"{name}[gpu{st.index}]", None if value is None else round(value, 4), unit,
                    **kw)


def job_gpu_idle(stats: list[GpuStats]) -> tuple[float | None, tuple[str, ...]]:
    """Mean idle share of the GPUs the job uses, and the signals it rests on."""
    used = [st for st in stats if st.job_uses_gpu and st.idle is not None and not st.lost]
    if not used:
        return None, ()
    signals = ("nvml utilization",) + (("nvml gpm",) if any(st.sm_active is not None
                                                              for st in used) else ())
    return sum(st.idle for st in used) / len(used), signals


def link_bound(stats: list[GpuStats], th: Thresholds) -> float:
    """GPU idle while a saturated PCIe link feeds it (0 when no link is near capacity)."""
    worst = 0.0
    for st in stats:
        cap = st.link_capacity()
        if cap and st.busy is not None and st.rx >= th.pcie_saturation * cap and \
                st.busy < th.pcie_busy_max:
            worst = max(worst, 1.0 - st.busy)
    return worst


def gpu_compute(stats: list[GpuStats]) -> float | None:
    """Share of time the job's GPUs compute: between GPM SM activity (a lower bound, SMs
    idle inside kernels) and NVML utilisation (an upper bound, it counts copies)."""
    used = [st for st in stats if st.job_uses_gpu and st.busy is not None and not st.lost]
    if not used:
        return None
    vals = [(st.busy + st.sm_active) / 2 if st.sm_active is not None else st.busy
            for st in used]
    return sum(vals) / len(vals)


def gpu_findings(stats: list[GpuStats], host: list[Finding], th: Thresholds,
                 cp: CriticalPath, metrics: dict) -> list[Finding]:
    """GPU findings over the loop window's per-GPU statistics."""
    out: list[Finding] = []
    for st in stats:
        own = _xfer(st, th, cp, metrics) + _launch(st, th)
        out += own + _tensor(st, th) + _memory(st, th) + _throttle(st, th)
        out += _idle(st, host + own, th, cp)
    out += _imbalance(stats, th)
    return out


def _idle(st: GpuStats, found: list[Finding], th: Thresholds, cp: CriticalPath
          ) -> list[Finding]:
    idle = st.idle
    if idle is None or idle < th.gpu_idle_warn or not st.job_uses_gpu:
        return []  # a CPU-only job on a GPU box leaves the GPU idle; that is not a finding
    explained = sum(f.impact for f in found if explains_gpu_idle(f.id))
    left = min(idle - explained, cp.unexplained if cp.gpu_idle is not None else idle)
    if left < th.gpu_idle_warn / 2 or explained >= idle / 2:
        return []  # the causes found say why; they carry the GPU-idle share
    ev = [_gpu_ev(st, "gpu_idle_share", idle, "ratio", threshold=th.gpu_idle_warn,
                  comparison=">=", setting="gpu_idle_warn", source="nvml utilization"),
          Evidence("explained_by_findings", round(explained, 4), "ratio",
                   source="critical path")]
    if st.job_sm is not None:
        ev.append(_gpu_ev(st, "job_sm_util", st.job_sm, "ratio", source="nvml per-process"))
    msg = (f"GPU {st.index} ({st.name}) is idle {idle:.0%} of the loop, and neither side "
           f"explains {left:.0%} of it: the loop thread is not waiting on data, storage, the "
           "GIL, a checkpoint or a copy, and not busy on the CPU either (no stack samples, or "
           "it is blocked on something gpudiag does not see: another process on the GPU, a "
           "stream it waits on, a lock).")
    actions = (
        "capture 20 steps with torch.profiler (or Nsight Systems) and look at the gaps "
        "between kernels on the GPU timeline",
        "check what else runs on the GPU (gpudiag top) and what the loop thread blocks on "
        "(py-spy dump --pid PID)",
    )
    bound = speedup_from_impact(left)
    return [Finding("GPU001", spec("GPU001").title, severity("GPU001", left, th),
                    _conf(st), left, msg, tuple(ev),
                    Recommendation("Find what the GPU waits for", actions), bound,
                    signals=("nvml utilization", "stacks"),
                    speedup_basis=f"a bound: x{bound:.2f} if the unexplained idle went away")]


def _launch(st: GpuStats, th: Thresholds) -> list[Finding]:
    if st.busy is None or st.sm_active is None:
        return []
    if st.busy < th.launch_util_min or st.sm_active > th.launch_sm_max:
        return []
    cap = st.link_capacity()
    if cap is not None and st.rx >= th.pcie_saturation * cap:
        return []  # busy copying over a saturated link, not launching: XFER001's case
    lost = 1.0 - st.sm_active / max(st.busy, 1e-6)
    ev = (_gpu_ev(st, "nvml_utilization", st.busy, "ratio", threshold=th.launch_util_min,
                  comparison=">=", setting="launch_util_min", source="nvml utilization"),
          _gpu_ev(st, "sm_active", st.sm_active, "ratio", threshold=th.launch_sm_max,
                  comparison="<=", setting="launch_sm_max", source="nvml gpm"))
    msg = (f"GPU {st.index} reads {st.busy:.0%} busy in nvidia-smi, but its SMs are active only "
           f"{st.sm_active:.0%} of the time: many tiny kernels keep it 'utilised' while most "
           "SMs wait. The job is launch-bound.")
    actions = ("torch.compile(model) to fuse small ops into fewer kernels",
               "CUDA graphs: torch.compile(model, mode='reduce-overhead') or "
               "torch.cuda.graphs for a static step",
               "larger batches (or micro-batch accumulation) so each kernel has more work")
    return [Finding("GPU002", spec("GPU002").title,
                    severity("GPU002", min(0.99, lost * st.busy), th), CONFIRMED_CONFIDENCE,
                    min(0.99, lost * st.busy), msg, ev,
                    Recommendation("Fewer, bigger kernels", actions),
                    speedup_from_impact(min(0.99, lost * st.busy)),
                    signals=("nvml utilization", "nvml gpm"))]


def _tensor(st: GpuStats, th: Thresholds) -> list[Finding]:
    if st.sm_active is None or st.tensor_active is None:
        return []
    if st.sm_active < th.tensor_sm_min or st.tensor_active > th.tensor_active_max:
        return []
    ev = [_gpu_ev(st, "sm_active", st.sm_active, "ratio", threshold=th.tensor_sm_min,
                  comparison=">=", setting="tensor_sm_min", source="nvml gpm"),
          _gpu_ev(st, "tensor_active", st.tensor_active, "ratio",
                  threshold=th.tensor_active_max, comparison="<=",
                  setting="tensor_active_max", source="nvml gpm")]
    model = identify(st.name)
    ratio = model.tf32_tflops / model.fp32_tflops if model and model.tf32_tflops and \
        model.fp32_tflops else None
    busy = st.busy if st.busy is not None else 1.0
    matrix = st.sm_active * busy   # share of the step the SMs spend on (fp32) matrix work
    if ratio is not None:
        after = (1.0 - matrix) + matrix / ratio
        speed = 1.0 / after
        impact = min(0.99, 1.0 - after)
        basis = (f"{model.label}'s TF32 tensor-core vs FP32 throughput ({model.tf32_tflops:g} vs "
                 f"{model.fp32_tflops:g} TFLOPS dense, x{ratio:.1f}) applied to the "
                 f"matrix-bound share ({matrix:.0%}: SM activity x GPU busy)")
        ev.append(_gpu_ev(st, "tf32_over_fp32", ratio, "x", source="datasheet"))
    else:
        impact = min(0.9, matrix * 0.5)
        speed = speedup_from_impact(impact)
        basis = ("no TF32 figure for this GPU: assumes tensor cores halve the matrix-bound "
                 "share (an estimate)")
    msg = (f"GPU {st.index}'s SMs are busy {st.sm_active:.0%} of the time but tensor cores "
           f"only {st.tensor_active:.1%}: matrix work runs in plain fp32.")
    actions = ("torch.backends.cuda.matmul.allow_tf32 = True and "
               "torch.backends.cudnn.allow_tf32 = True (or "
               "torch.set_float32_matmul_precision('high'))",
               "with torch.autocast(device_type='cuda', dtype=torch.bfloat16): around the "
               "forward pass and loss (faster still, and half the activation memory)")
    return [Finding("GPU003", spec("GPU003").title, severity("GPU003", impact, th),
                    CONFIRMED_CONFIDENCE, impact, msg, tuple(ev),
                    Recommendation("Enable TF32 or bf16 autocast", actions), speed,
                    signals=("nvml gpm",), speedup_basis=basis)]


def _xfer(st: GpuStats, th: Thresholds, cp: CriticalPath, metrics: dict) -> list[Finding]:
    """XFER001 from the loop's copy phase (pageable sources) or from a saturated link."""
    cap = st.link_capacity()
    busy = st.busy if st.busy is not None else 1.0
    rx = st.rx
    near = cap is not None and rx >= th.pcie_saturation * cap
    copy = cp.caused("h2d_copy") if cp.gpu_idle is not None else 0.0
    copy_share = metrics.get("h2d_copy_per_step_s") or 0.0
    sps = metrics.get("steps_per_second")
    copy_share = min(1.0, copy_share * sps) if sps else 0.0
    pinned = metrics.get("h2d_pinned_ratio")
    pageable = pinned is not None and pinned < 0.5
    stalls = copy_share >= th.h2d_copy_warn and copy >= th.h2d_copy_warn
    if not (stalls or near):
        return []
    ev = [Evidence("h2d_copy_share", round(copy_share, 4), "ratio", th.h2d_copy_warn,
                   ">=" if copy_share >= th.h2d_copy_warn else "<", "h2d_copy_warn",
                   "in-process hooks")]
    if pinned is not None:
        ev.append(Evidence("h2d_pinned_ratio", round(pinned, 4), "ratio",
                           source="in-process hooks"))
    if cap is not None:
        ev.append(_gpu_ev(st, "pcie_rx_share_of_link", rx / cap, "ratio",
                          threshold=th.pcie_saturation, comparison=">=" if near else "<",
                          setting="pcie_saturation", source="nvml pcie counters"))
        ev.append(_gpu_ev(st, "pcie_rx", rx / 1e9, "GB/s", source="nvml pcie counters"))
        ev.append(_gpu_ev(st, "pcie_link", cap / 1e9, "GB/s",
                          source=f"gen{st.pcie_gen:.0f} x{st.pcie_width:.0f}"))
    ev.append(_gpu_ev(st, "gpu_busy", busy, "ratio", source="nvml utilization"))
    link = ""
    if st.pcie_gen_max and st.pcie_gen and st.pcie_gen < st.pcie_gen_max or \
            (st.pcie_width_max and st.pcie_width and st.pcie_width < st.pcie_width_max):
        link = (f" The link runs at gen{st.pcie_gen:.0f} x{st.pcie_width:.0f} but supports "
                f"gen{st.pcie_gen_max:.0f} x{st.pcie_width_max:.0f}: check the slot/riser.")
    if stalls:
        # the copy phase of the loop, made at the rate pinned memory reaches on this link
        impact = copy
        rate_now = rx / copy_share if copy_share > 0 else rx
        pinned_rate = th.pinned_link_efficiency * cap if cap else None
        if pageable and pinned_rate and rate_now > 0 and rate_now < pinned_rate:
            after = (1.0 - copy_share) + copy_share * rate_now / pinned_rate
            speed = 1.0 / max(1e-3, after)
            basis = (f"the copy phase ({copy_share:.0%} of the step at {rate_now / 1e9:.1f} "
                     f"GB/s from pageable memory) at {pinned_rate / 1e9:.0f} GB/s pinned "
                     f"({th.pinned_link_efficiency:.0%} of the link), the rest unchanged")
        else:
            speed = speedup_from_impact(copy)
            basis = f"a bound: x{speed:.2f} if the copies overlapped compute entirely"
        kind = "from pageable (unpinned) host memory" if pageable else "on the loop's path"
        msg = (f"The loop spends {copy_share:.0%} of its time in host-to-device copies {kind}; "
               f"GPU {st.index} idles {copy:.0%} of the loop waiting for them (the link carries "
               f"{rx / 1e9:.1f} GB/s" + (f" of {cap / 1e9:.0f} GB/s" if cap else "") + ")."
               + link)
        actions = ("pin the source: DataLoader(..., pin_memory=True), or tensor.pin_memory() "
                   "once for data reused every step",
                   "copy with .to('cuda', non_blocking=True) so the copy overlaps compute",
                   "or keep data that does not change on the GPU instead of copying it each step",
                   "send uint8 images and convert/normalise on the GPU (4x fewer bytes than fp32)")
        summary = "Pinned memory and non_blocking copies" if pageable else \
            "Overlap the copies, send fewer bytes"
    else:
        impact = 0.0 if busy >= th.pcie_busy_max else min(0.99, 1.0 - busy)
        speed = speedup_from_impact(impact)
        basis = ("the link is the bound: fewer bytes per step is the only way up" if impact == 0
                 else f"a bound: x{speed:.2f} if the GPU never waited for the link")
        msg = (f"GPU {st.index} receives {rx / 1e9:.1f} GB/s over a {cap / 1e9:.1f} GB/s link "
               f"({rx / cap:.0%}): host-to-device bandwidth is the bound for this job." + link)
        actions = ("DataLoader(..., pin_memory=True) and .to('cuda', non_blocking=True) so the "
                   "copies overlap compute instead of preceding it",
                   "send fewer bytes: uint8 instead of fp32 (4x), compressed or cropped inputs",
                   "keep data that does not change on the GPU instead of copying it each step",
                   "do augmentation on the GPU (torchvision.transforms.v2 on CUDA tensors, DALI)")
        summary = "Move fewer bytes over PCIe"
    sev = severity("XFER001", impact, th) if impact >= th.h2d_copy_warn else "note"
    return [Finding("XFER001", spec("XFER001").title, sev, _conf(st, 0.7), min(0.99, impact),
                    msg, tuple(ev), Recommendation(summary, actions), speed,
                    signals=("nvml pcie counters", "in-process hooks"), speedup_basis=basis)]


def _memory(st: GpuStats, th: Thresholds) -> list[Finding]:
    if not st.mem_peak or not st.mem_total:
        return []
    frac = st.mem_peak / st.mem_total
    peak_g, total_g = st.mem_peak / GIB, st.mem_total / GIB
    ev = (_gpu_ev(st, "vram_peak", peak_g, "GiB", source="nvml memory"),
          _gpu_ev(st, "vram_total", total_g, "GiB", source="nvml memory"))
    if frac >= th.mem_near_limit:
        e = ev + (_gpu_ev(st, "vram_peak_share", frac, "ratio", threshold=th.mem_near_limit,
                          comparison=">=", setting="mem_near_limit", source="nvml memory"),)
        msg = (f"GPU {st.index} peaked at {peak_g:.1f} of {total_g:.1f} GiB ({frac:.0%}): one "
               "larger batch or a fragmented cache away from out-of-memory, and the caching "
               "allocator may be freeing and retrying (slow).")
        actions = ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation",
                   "activation checkpointing (torch.utils.checkpoint) or a smaller batch with "
                   "gradient accumulation", "bf16 autocast halves activation memory")
        return [Finding("MEM002", "VRAM near the limit", "warning", 0.8, 0.0, msg, e,
                        Recommendation("Leave memory headroom", actions), 1.0,
                        signals=("nvml memory",))]
    if frac > th.mem_headroom_max:
        return []
    mult = max(1, math.floor(0.85 * st.mem_total / st.mem_peak))
    need_g = peak_g * 1.25
    fits = sorted((m for m in MODELS if need_g <= m.memory_gib < total_g * 0.9),
                  key=lambda m: (m.memory_gib, m.on_demand_usd))
    smaller = fits[0].label if fits else None
    e = ev + (_gpu_ev(st, "vram_peak_share", frac, "ratio", threshold=th.mem_headroom_max,
                      comparison="<=", setting="mem_headroom_max", source="nvml memory"),)
    msg = (f"The job peaks at {peak_g:.1f} GiB of GPU {st.index}'s {total_g:.0f} GiB "
           f"({frac:.0%}). About {mult}x the batch would still fit (activations scale with "
           "batch size, weights do not; so this is an upper estimate)"
           + (f"; a {smaller} GPU has the memory for it with 25% margin (memory only: the "
              "cost section's right-sizing also checks the compute)." if smaller else "."))
    actions = [f"raise the batch size up to ~{mult}x (scale the learning rate with it), "
               "watching VRAM with gpudiag"]
    if smaller:
        actions.append(f"or run on a smaller GPU: {smaller} fits {need_g:.1f} GiB "
                       "(peak + 25%)")
    return [Finding("MEM001", "VRAM headroom: the job uses a small share of GPU memory",
                    "note", 0.8, 0.0, msg, e,
                    Recommendation(f"Use the memory: batch up to ~{mult}x, or a smaller GPU",
                                   tuple(actions)), 1.0, signals=("nvml memory",))]


REASON_TEXT = {"power_cap": "the software power cap", "hw_slowdown": "hardware slowdown",
               "sw_thermal": "software thermal slowdown", "hw_thermal": "hardware thermal "
               "slowdown", "power_brake": "the power brake (external power supply signal)"}


def _throttle(st: GpuStats, th: Thresholds) -> list[Finding]:
    """THROT001 when something holds the clocks back: thermal or hardware slowdown, the power
    brake, or a power cap set below the board's default. Running at the default power cap
    under full load is how the GPU is meant to run: at most a note."""
    if not st.throttle:
        return []
    reason, share = max(st.throttle.items(), key=lambda kv: kv[1])
    busy = st.busy or 0.0
    of_busy = min(1.0, share / busy) if busy > 0 else share
    if share < th.throttle_warn:
        return []
    clock_lost = None
    if st.sm_clock and st.sm_clock_max:
        clock_lost = max(0.0, 1.0 - st.sm_clock / st.sm_clock_max)
    ev = [_gpu_ev(st, f"throttle_{reason}", share, "ratio", threshold=th.throttle_warn,
                  comparison=">=", setting="throttle_warn", source="nvml clock events"),
          _gpu_ev(st, "throttled_share_of_busy", of_busy, "ratio", source="nvml")]
    if clock_lost is not None:
        ev.append(_gpu_ev(st, "sm_clock_below_max", clock_lost, "ratio", source="nvml clocks"))
    lowered = (reason == "power_cap" and st.power_limit is not None
               and st.power_default is not None
               and st.power_limit < th.power_cap_lowered * st.power_default)
    if st.power_limit is not None:
        ev.append(_gpu_ev(st, "power_limit", st.power_limit, "W", source="nvml"))
    if st.power_default is not None:
        ev.append(_gpu_ev(st, "power_default_limit", st.power_default, "W",
                          threshold=th.power_cap_lowered, comparison="ratio <" if lowered
                          else "ratio >=", setting="power_cap_lowered", source="nvml"))
    lost_txt = f", SM clock {clock_lost:.0%} below its maximum" if clock_lost is not None else ""
    if reason == "power_cap" and not lowered:
        limit = f" ({st.power_limit:.0f} W)" if st.power_limit else ""
        msg = (f"GPU {st.index} ran at its power limit{limit} {share:.0%} of the time "
               f"({of_busy:.0%} of its busy time){lost_txt}. That is normal under full load: "
               "the clocks adapt to the power budget" + ("" if st.power_default is not None
                                                          else "; the default limit was not "
                                                          "recorded, so a lowered cap cannot be "
                                                          "ruled out") + ".")
        return [Finding("THROT001", "GPU at its power limit (normal under full load)", "note",
                        0.9, 0.0, msg, tuple(ev),
                        Recommendation("Nothing to fix at the default power limit",
                                       ("nvidia-smi -q -d POWER shows the enforced and default "
                                        "limits",)), 1.0, signals=("nvml clock events",),
                        speedup_basis="none: the board runs at its default power budget")]
    msg = (f"GPU {st.index} was held back by {REASON_TEXT.get(reason, reason)} {share:.0%} of "
           f"the time ({of_busy:.0%} of its busy time){lost_txt}"
           + (f"; its power limit is {st.power_limit:.0f} W, below the default "
              f"{st.power_default:.0f} W" if lowered else "") + ".")
    if "thermal" in reason:
        actions = ("check cooling: fan speed, airflow, inlet temperature, dust",
                   "nvidia-smi -q -d TEMPERATURE,PERFORMANCE shows the slowdown thresholds")
    else:
        actions = ("nvidia-smi -q -d POWER: compare the enforced limit with the default; "
                   f"restore it with nvidia-smi -pl {st.power_default or 0:.0f}"
                   if lowered else "nvidia-smi -q -d POWER: check the enforced limit",
                   "check the PSU and power cabling when the power brake engages")
    impact = min(0.99, of_busy * (clock_lost if clock_lost is not None else 0.2) * busy)
    return [Finding("THROT001", f"GPU clocks throttled by {REASON_TEXT.get(reason, reason)}",
                    severity("THROT001", impact, th), 0.9, impact, msg, tuple(ev),
                    Recommendation("Remove the cause of the slowdown", actions),
                    speedup_from_impact(impact), signals=("nvml clock events",),
                    speedup_basis="the lost clock share given back during busy time")]


def _imbalance(stats: list[GpuStats], th: Thresholds) -> list[Finding]:
    busy = [s for s in stats if s.busy is not None and not s.lost]
    if len(busy) < 2:
        return []
    hi, lo = max(busy, key=lambda s: s.busy), min(busy, key=lambda s: s.busy)
    spread = hi.busy - lo.busy
    if spread < th.gpu_imbalance:
        return []
    ev = tuple(_gpu_ev(s, "gpu_busy", s.busy, "ratio", source="nvml utilization")
               for s in busy) + (Evidence("busy_spread", round(spread, 4), "ratio",
                                          th.gpu_imbalance, ">=", "gpu_imbalance", "nvml"),)
    msg = (f"The job's GPUs are unevenly loaded: GPU {hi.index} busy {hi.busy:.0%}, GPU "
           f"{lo.index} only {lo.busy:.0%}. The busiest sets the pace; the others wait.")
    actions = ("check that every rank gets the same batch size and sequence lengths "
               "(bucket or pad variable-length inputs)",
               "with DataParallel, switch to DistributedDataParallel (DataParallel gathers on "
               "GPU 0)", "look for work done only on rank 0 (logging, evaluation, saving)")
    impact = spread * 0.5
    return [Finding("GPU004", spec("GPU004").title, severity("GPU004", impact, th),
                    NVML_ONLY_CONFIDENCE, impact, msg, ev,
                    Recommendation("Balance the work across GPUs", actions),
                    speedup_from_impact(impact), signals=("nvml utilization",))]
