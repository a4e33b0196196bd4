"""GPU findings from NVML samples: idle GPU, launch-bound, no tensor cores, PCIe-bound,
VRAM headroom or pressure, throttling, uneven GPUs.

Each finding says which signal it rests on. NVML "utilisation" only says that some kernel
was running; findings resting on it alone get a lower confidence than those that GPM SM
activity or the host-side stacks confirm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from gpudiag.analyzers.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.thresholds import Thresholds
from gpudiag.analyzers.timeline import Timeline

NVML_ONLY_CONFIDENCE = 0.6
CONFIRMED_CONFIDENCE = 0.9
GIB = 2 ** 30
# PCIe payload bandwidth per lane and direction, GB/s, by generation.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# Smaller GPUs a job could move to, by memory (GiB): the usual data-centre/workstation parts.
GPU_SIZES = ((16, "T4 / V100 16 GB"), (24, "L4 / A10G / RTX 4090 (24 GB)"),
             (40, "A100 40 GB"), (48, "L40S / RTX 6000 Ada (48 GB)"),
             (80, "A100 / H100 80 GB"), (141, "H200 (141 GB)"))
HOST_IDS = ("DATA001", "DATA002", "IO001", "GIL001", "CKPT001", "SYNC001", "XFER001")
EXPLAINS_IDLE = HOST_IDS + ("GPU002",)


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
    throttle: dict[str, float] = field(default_factory=dict)
    lost: bool = False
    job_uses_gpu: bool = True

    @property
    def idle(self) -> float | None:
        """Share of time no kernel of anyone ran (1 - NVML utilisation)."""
        return None if self.busy is None else max(0.0, 1.0 - self.busy)

    def link_capacity(self) -> float | None:
        """Current PCIe link's payload bandwidth per direction, bytes/s."""
        if not self.pcie_gen or not self.pcie_width:
            return None
        return PCIE_LANE_GBPS.get(int(self.pcie_gen), 0.0) * self.pcie_width * 1e9


def gpu_stats(tl: Timeline) -> list[GpuStats]:
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


def gpu_findings(tl: Timeline, host: list[Finding], th: Thresholds,
                 h2d_share: float = 0.0) -> tuple[list[Finding], list[GpuStats]]:
    """GPU findings, and the per-GPU statistics they rest on."""
    stats = [s for s in gpu_stats(tl) if s.samples > 0]
    out: list[Finding] = []
    for st in stats:
        own = _xfer(st, th, h2d_share) + _launch(st, th)
        out += own + _tensor(st, th) + _memory(st, th) + _throttle(st, th)
        out += _idle(st, host + own, th)
    out += _imbalance(stats, th)
    return out, stats


def _idle(st: GpuStats, host: list[Finding], th: Thresholds) -> list[Finding]:
    idle = st.idle
    if idle is None or idle < th.gpu_idle_warn or not st.job_uses_gpu:
        return []  # a CPU-only job on a GPU box leaves the GPU idle; that is not a finding
    explained = sum(f.impact for f in host if f.id in EXPLAINS_IDLE)
    if explained >= idle / 2:
        return []  # the host-side findings say why; they carry the GPU-idle share
    ev = [_gpu_ev(st, "gpu_idle_share", idle, "ratio", threshold=th.gpu_idle_warn,
                  comparison=">=", setting="gpu_idle_warn", source="nvml utilization"),
          Evidence("host_findings_impact", round(explained, 4), "ratio", source="stacks")]
    if st.job_sm is not None:
        ev.append(_gpu_ev(st, "job_sm_util", st.job_sm, "ratio", source="nvml per-process"))
    msg = (f"GPU {st.index} ({st.name}) is idle {idle:.0%} of the time, and the host side "
           f"shows no input, storage, GIL or checkpoint wait that explains it (host findings "
           f"cover {explained:.0%}). The gaps are between kernels: launches, small batches, "
           "or host work in the loop that the stacks count as compute.")
    actions = (
        "capture 20 steps with torch.profiler (or Nsight Systems) and look at the gaps "
        "between kernels on the GPU timeline",
        "raise the batch size (see MEM001 for the room there is) so each launch does more work",
        "cut per-step Python and launch overhead: torch.compile(model), CUDA graphs "
        "(torch.compile(mode='reduce-overhead'))",
    )
    return [Finding("GPU001", "GPU idle most of the time; the cause is not on the host side",
                    "warning", _conf(st), idle, msg, tuple(ev),
                    Recommendation("Find and close the gaps between kernels", actions),
                    speedup_from_impact(idle), signals=("nvml utilization", "stacks"))]


def _launch(st: GpuStats, th: Thresholds) -> list[Finding]:
    if st.busy is None or st.sm_active is None:
        return []
    if st.busy < th.launch_util_min or st.sm_active > th.launch_sm_max:
        return []
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
    return [Finding("GPU002", "Launch-bound: the GPU looks busy but its SMs are mostly idle",
                    "warning", CONFIRMED_CONFIDENCE, min(0.99, lost * st.busy), msg, ev,
                    Recommendation("Fewer, bigger kernels", actions),
                    speedup_from_impact(min(0.99, lost * st.busy)),
                    signals=("nvml utilization", "nvml gpm"))]


def _tensor(st: GpuStats, th: Thresholds) -> list[Finding]:
    if st.sm_active is None or st.tensor_active is None:
        return []
    if st.sm_active < th.tensor_sm_min or st.tensor_active > th.tensor_active_max:
        return []
    ev = (_gpu_ev(st, "sm_active", st.sm_active, "ratio", threshold=th.tensor_sm_min,
                  comparison=">=", setting="tensor_sm_min", source="nvml gpm"),
          _gpu_ev(st, "tensor_active", st.tensor_active, "ratio",
                  threshold=th.tensor_active_max, comparison="<=",
                  setting="tensor_active_max", source="nvml gpm"))
    msg = (f"GPU {st.index}'s SMs are busy {st.sm_active:.0%} of the time but tensor cores "
           f"only {st.tensor_active:.1%}: matrix work runs in plain fp32.")
    actions = ("torch.backends.cuda.matmul.allow_tf32 = True and "
               "torch.backends.cudnn.allow_tf32 = True (or "
               "torch.set_float32_matmul_precision('high'))",
               "with torch.autocast(device_type='cuda', dtype=torch.bfloat16): around the "
               "forward pass and loss")
    impact = min(0.9, st.sm_active * 0.5)  # tensor cores typically halve matmul-bound time
    return [Finding("GPU003", "Matrix work not on tensor cores (fp32 without TF32/AMP)",
                    "warning", CONFIRMED_CONFIDENCE, impact, msg, ev,
                    Recommendation("Enable TF32 or bf16 autocast", actions),
                    speedup_from_impact(impact), signals=("nvml gpm",))]


def _xfer(st: GpuStats, th: Thresholds, h2d_share: float) -> list[Finding]:
    cap = st.link_capacity()
    busy = st.busy if st.busy is not None else 1.0
    rx = st.pcie_rx or 0.0
    near = cap is not None and rx >= th.pcie_saturation * cap and busy < th.pcie_busy_max
    stacks = h2d_share >= th.h2d_copy_warn
    if not (near or stacks):
        return []
    ev = []
    if cap is not None:
        ev.append(_gpu_ev(st, "pcie_rx_share_of_link", rx / cap, "ratio",
                          threshold=th.pcie_saturation, comparison=">=" if near else "<",
                          setting="pcie_saturation", source="nvml pcie counters"))
        ev.append(_gpu_ev(st, "pcie_rx", rx / 1e9, "GB/s", source="nvml pcie counters"))
        ev.append(_gpu_ev(st, "pcie_link", cap / 1e9, "GB/s",
                          source=f"gen{st.pcie_gen:.0f} x{st.pcie_width:.0f}"))
    ev.append(_gpu_ev(st, "gpu_busy", busy, "ratio", threshold=th.pcie_busy_max,
                      comparison="<", setting="pcie_busy_max", source="nvml utilization"))
    if stacks:
        ev.append(Evidence("h2d_copy_share", round(h2d_share, 4), "ratio", th.h2d_copy_warn,
                           ">=", "h2d_copy_warn", "stacks"))
    link = ""
    if st.pcie_gen_max and st.pcie_gen and st.pcie_gen < st.pcie_gen_max or \
            (st.pcie_width_max and st.pcie_width and st.pcie_width < st.pcie_width_max):
        link = (f" The link runs at gen{st.pcie_gen:.0f} x{st.pcie_width:.0f} but supports "
                f"gen{st.pcie_gen_max:.0f} x{st.pcie_width_max:.0f}: check the slot/riser.")
    msg = (f"Host-to-device copies limit GPU {st.index}: it receives {rx / 1e9:.1f} GB/s"
           + (f" of a {cap / 1e9:.1f} GB/s link" if cap else "")
           + f" while busy only {busy:.0%}.{link}")
    actions = ("DataLoader(..., pin_memory=True) and batch.to('cuda', non_blocking=True)",
               "send uint8 images and convert/normalise on the GPU (4x fewer bytes than fp32)",
               "do augmentation on the GPU (torchvision.transforms.v2 on CUDA tensors, DALI)")
    impact = max(1.0 - busy, h2d_share) if near else h2d_share
    return [Finding("XFER001", "Host-to-device copies stall the loop", "warning",
                    _conf(st, 0.7), min(0.99, impact), msg, tuple(ev),
                    Recommendation("Pinned memory, fewer bytes, overlap the copies", actions),
                    speedup_from_impact(min(0.99, impact)),
                    signals=("nvml pcie counters", "stacks"))]


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
    smaller = next((label for size, label in GPU_SIZES if need_g <= size < total_g * 0.9),
                   None)
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
    lost_txt = f", SM clock {clock_lost:.0%} below its maximum" if clock_lost is not None else ""
    msg = (f"GPU {st.index} was held back by {REASON_TEXT.get(reason, reason)} {share:.0%} of "
           f"the time ({of_busy:.0%} of its busy time){lost_txt}.")
    if "thermal" in reason:
        actions = ("check cooling: fan speed, airflow, inlet temperature, dust",
                   "nvidia-smi -q -d TEMPERATURE,PERFORMANCE shows the slowdown thresholds")
    else:
        actions = ("nvidia-smi -q -d POWER: compare the enforced limit with the default; "
                   "raise it (nvidia-smi -pl) if a lower cap was set",
                   "check the PSU and power cabling when the power brake engages")
    impact = min(0.99, of_busy * (clock_lost if clock_lost is not None else 0.2) * busy)
    return [Finding("THROT001", f"GPU clocks throttled by {REASON_TEXT.get(reason, reason)}",
                    "warning", 0.9, impact, msg, tuple(ev),
                    Recommendation("Remove the cause of the slowdown", actions),
                    speedup_from_impact(impact), signals=("nvml clock events",))]


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
    return [Finding("GPU004", "GPUs of the job are unevenly loaded", "warning",
                    NVML_ONLY_CONFIDENCE, impact, msg, ev,
                    Recommendation("Balance the work across GPUs", actions),
                    speedup_from_impact(impact), signals=("nvml utilization",))]


def with_gpu_idle(findings: list[Finding], stats: list[GpuStats]) -> list[Finding]:
    """Host-side findings state the GPU-idle share they cause when a GPU is present."""
    idle = [s.idle for s in stats if s.idle is not None]
    if not idle:
        return findings
    mean_idle = sum(idle) / len(idle)
    out = []
    for f in findings:
        if f.id in HOST_IDS and f.id != "XFER001":
            cause = min(f.impact, mean_idle)
            f = replace(f, message=f"{f.message} The GPU sat idle {mean_idle:.0%} of the time; "
                                   f"this cause accounts for about {cause:.0%} of it.",
                        evidence=f.evidence + (Evidence("gpu_idle_share", round(mean_idle, 4),
                                                        "ratio", source="nvml utilization"),
                                               Evidence("gpu_idle_caused", round(cause, 4),
                                                        "ratio", source="stacks+nvml")),
                        signals=f.signals + ("nvml utilization",))
        out.append(f)
    return out
