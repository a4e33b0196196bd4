"""GPU findings from NVML samples: idle GPU, launch-bound, no tensor cores, uneven GPUs;
`find` runs them with those of gpu_transfer (PCIe-bound), gpu_memory (VRAM headroom or
pressure) and gpu_throttle (clocks held back).

Each finding says which signal it rests on. NVML "utilisation" only says that some kernel
was running; findings resting on it alone get a lower confidence than those that GPM SM
activity or the host-side stacks confirm.
"""

from __future__ import annotations

from dataclasses import replace

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.cost.prices import identify
from gpudiag.analyzers.cost.projection import right_size_line
from gpudiag.analyzers.findings.gpu_memory import MEM001, MEM002, memory_findings
from gpudiag.analyzers.findings.gpu_throttle import THROT001, throttle_findings
from gpudiag.analyzers.findings.gpu_transfer import XFER001, transfer_findings
from gpudiag.analyzers.measures.critical_path import CriticalPath
from gpudiag.analyzers.measures.gpu_stats import (
    CONFIRMED_CONFIDENCE,
    NVML_ONLY_CONFIDENCE,
    GpuStats,
    confidence,
    gpu_evidence,
)
from gpudiag.analyzers.model.catalogue import (
    Doc,
    Measured,
    Spec,
    explains_gpu_idle,
    new_finding,
    register,
)
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation, speedup_from_impact
from gpudiag.analyzers.model.thresholds import Thresholds

GPU001 = register(
    Spec(
        "GPU001",
        "GPU idle most of the time; neither side explains the gaps",
        "gpu",
        False,
        reads=("gpu_idle",),
        doc=Doc(
            means=(
                "the job's GPU idles and neither side explains the gaps (no stacks, or the loop "
                "blocked on something gpudiag does not see)"
            ),
            fix="profile the kernel gaps; check what else uses the GPU",
            measured=(
                Measured(
                    impact="the unexplained idle",
                    speedup="a bound",
                ),
            ),
        ),
    )
)

GPU002 = register(
    Spec(
        "GPU002",
        "Launch-bound: the GPU looks busy but its SMs are mostly idle",
        "gpu",
        True,
        reads=("gpu_idle",),
        doc=Doc(
            means=(
                "launch-bound: NVML utilisation high, GPM SM activity low (Hopper+), not "
                "explained by copies"
            ),
            fix="fuse kernels (torch.compile), CUDA graphs, bigger batches",
        ),
    )
)

GPU003 = register(
    Spec(
        "GPU003",
        "Matrix work not on tensor cores (fp32 without TF32/AMP)",
        "gpu",
        False,
        reads=("gpu_idle",),
        doc=Doc(
            means=(
                "SMs busy but tensor cores idle: fp32 matmuls (Hopper+); not where the SMs wait "
                "on DRAM (GPM DRAM bandwidth per unit of SM activity at `tensor_dram_ratio_max`, "
                "0.5, or more: elementwise passes, which tensor cores would not speed up)"
            ),
            fix="the exact TF32 settings, bf16 autocast",
            measured=(
                Measured(
                    impact="the matrix time tensor cores would save",
                    speedup=(
                        "the GPU's TF32/FP32 datasheet ratio (H100 SXM: x7.4) applied to the "
                        "matrix-bound share (SM activity x busy)"
                    ),
                    checked="x5.2 / x5.4",
                ),
            ),
        ),
    )
)

GPU004 = register(
    Spec(
        "GPU004",
        "GPUs of the job are unevenly loaded",
        "gpu",
        False,
        reads=("gpu_idle",),
        doc=Doc(
            means="the job's GPUs are unevenly loaded",
            fix="per-GPU evidence; balance batches, DDP instead of DataParallel",
        ),
    )
)


def _idle(st: GpuStats, found: list[Finding], th: Thresholds, cp: CriticalPath) -> list[Finding]:
    idle = st.idle
    if idle is None or idle < th.gpu_idle_warn or not st.job_uses_gpu:
        return []  # a CPU-only job on a GPU box leaves the GPU idle; that is not a finding
    explained = sum(f.impact for f in found if explains_gpu_idle(f.id))
    left = min(idle - explained, cp.unexplained if cp.gpu_idle is not None else idle)
    if left < th.gpu_idle_warn / 2 or explained >= idle / 2:
        return []  # the causes found say why; they carry the GPU-idle share
    ev = [
        gpu_evidence(
            st,
            "gpu_idle_share",
            idle,
            "ratio",
            threshold=th.gpu_idle_warn,
            comparison=">=",
            setting="gpu_idle_warn",
            source="nvml utilization",
        ),
        Evidence("explained_by_findings", round(explained, 4), "ratio", source="critical path"),
    ]
    if st.job_sm is not None:
        ev.append(gpu_evidence(st, "job_sm_util", st.job_sm, "ratio", source="nvml per-process"))
    msg = (
        f"GPU {st.index} ({st.name}) is idle {idle:.0%} of the loop, and neither side "
        f"explains {left:.0%} of it: the loop thread is not waiting on data, storage, the "
        "GIL, a checkpoint or a copy, and not busy on the CPU either (no stack samples, or "
        "it is blocked on something gpudiag does not see: another process on the GPU, a "
        "stream it waits on, a lock)."
    )
    actions = (
        "capture 20 steps with torch.profiler (or Nsight Systems) and look at the gaps "
        "between kernels on the GPU timeline",
        "check what else runs on the GPU (gpudiag top) and what the loop thread blocks on "
        "(py-spy dump --pid PID)",
    )
    bound = speedup_from_impact(left)
    return [
        new_finding(
            "GPU001",
            th,
            confidence=confidence(st),
            impact=left,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation("Find what the GPU waits for", actions),
            expected_speedup=bound,
            signals=("nvml utilization", "stacks"),
            speedup_basis=f"a bound: x{bound:.2f} if the unexplained idle went away",
            speedup_kind="bound",
        )
    ]


def _launch(st: GpuStats, th: Thresholds) -> list[Finding]:
    if st.busy is None or st.sm_active is None:
        return []
    if st.busy < th.launch_util_min or st.sm_active > th.launch_sm_max:
        return []
    cap = st.link_capacity()
    if cap is not None and st.rx >= th.pcie_saturation * cap:
        return []  # busy copying over a saturated link, not launching: XFER001's case
    lost = 1.0 - st.sm_active / max(st.busy, 1e-6)
    ev = (
        gpu_evidence(
            st,
            "nvml_utilization",
            st.busy,
            "ratio",
            threshold=th.launch_util_min,
            comparison=">=",
            setting="launch_util_min",
            source="nvml utilization",
        ),
        gpu_evidence(
            st,
            "sm_active",
            st.sm_active,
            "ratio",
            threshold=th.launch_sm_max,
            comparison="<=",
            setting="launch_sm_max",
            source="nvml gpm",
        ),
    )
    msg = (
        f"GPU {st.index} reads {st.busy:.0%} busy in nvidia-smi, but its SMs are active only "
        f"{st.sm_active:.0%} of the time: many tiny kernels keep it 'utilised' while most "
        "SMs wait. The job is launch-bound."
    )
    actions = (
        "torch.compile(model) to fuse small ops into fewer kernels",
        "CUDA graphs: torch.compile(model, mode='reduce-overhead') or "
        "torch.cuda.graphs for a static step",
        "larger batches (or micro-batch accumulation) so each kernel has more work",
    )
    return [
        new_finding(
            "GPU002",
            th,
            confidence=CONFIRMED_CONFIDENCE,
            impact=min(0.99, lost * st.busy),
            message=msg,
            evidence=ev,
            recommendation=Recommendation("Fewer, bigger kernels", actions),
            expected_speedup=speedup_from_impact(min(0.99, lost * st.busy)),
            signals=("nvml utilization", "nvml gpm"),
            speedup_basis=f"the busy time its SMs sit idle ({lost:.0%} of {st.busy:.0%} busy) "
            "given back: fewer, bigger kernels keep the SMs fed",
        )
    ]


def memory_bound(st: GpuStats, th: Thresholds) -> bool:
    """The SMs' activity is mostly waiting on DRAM (elementwise passes, reductions): the
    GPM DRAM bandwidth is high for that activity. Unknown (no GPM DRAM counter): False."""
    if st.dram_bw is None or not st.sm_active:
        return False
    return st.dram_bw / st.sm_active >= th.tensor_dram_ratio_max


def _tensor(st: GpuStats, th: Thresholds) -> list[Finding]:
    if st.sm_active is None or st.tensor_active is None:
        return []
    if st.sm_active < th.tensor_sm_min or st.tensor_active > th.tensor_active_max:
        return []
    if memory_bound(st, th):
        return []
    ev = [
        gpu_evidence(
            st,
            "sm_active",
            st.sm_active,
            "ratio",
            threshold=th.tensor_sm_min,
            comparison=">=",
            setting="tensor_sm_min",
            source="nvml gpm",
        ),
        gpu_evidence(
            st,
            "tensor_active",
            st.tensor_active,
            "ratio",
            threshold=th.tensor_active_max,
            comparison="<=",
            setting="tensor_active_max",
            source="nvml gpm",
        ),
    ]
    model = identify(st.name)
    ratio = (
        model.tf32_tflops / model.fp32_tflops
        if model and model.tf32_tflops and model.fp32_tflops
        else None
    )
    busy = st.busy if st.busy is not None else 1.0
    matrix = st.sm_active * busy  # share of the step the SMs spend on (fp32) matrix work
    if ratio is not None:
        assert model is not None  # a ratio comes from the model's datasheet
        after = (1.0 - matrix) + matrix / ratio
        speed = 1.0 / after
        impact = min(0.99, 1.0 - after)
        basis = (
            f"{model.label}'s TF32 tensor-core vs FP32 throughput ({model.tf32_tflops:g} vs "
            f"{model.fp32_tflops:g} TFLOPS dense, x{ratio:.1f}) applied to the "
            f"matrix-bound share ({matrix:.0%}: SM activity x GPU busy)"
        )
        ev.append(gpu_evidence(st, "tf32_over_fp32", ratio, "x", source="datasheet"))
    else:
        impact = min(0.9, matrix * 0.5)
        speed = speedup_from_impact(impact)
        basis = (
            "no TF32 figure for this GPU: assumes tensor cores halve the matrix-bound "
            "share (an estimate)"
        )
    msg = (
        f"GPU {st.index}'s SMs are busy {st.sm_active:.0%} of the time but tensor cores "
        f"only {st.tensor_active:.1%}: matrix work runs in plain fp32."
    )
    actions = (
        "torch.backends.cuda.matmul.allow_tf32 = True and "
        "torch.backends.cudnn.allow_tf32 = True (or "
        "torch.set_float32_matmul_precision('high'))",
        "with torch.autocast(device_type='cuda', dtype=torch.bfloat16): around the "
        "forward pass and loss (faster still, and half the activation memory)",
    )
    return [
        new_finding(
            "GPU003",
            th,
            confidence=CONFIRMED_CONFIDENCE,
            impact=impact,
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation("Enable TF32 or bf16 autocast", actions),
            expected_speedup=speed,
            signals=("nvml gpm",),
            speedup_basis=basis,
            fix={"kind": "tf32", "values": {}},
        )
    ]


def _busy(st: GpuStats) -> float:
    return st.busy if st.busy is not None else 0.0


def _imbalance(stats: list[GpuStats], th: Thresholds) -> list[Finding]:
    busy = [s for s in stats if s.busy is not None and not s.lost]
    if len(busy) < 2:
        return []
    hi, lo = max(busy, key=_busy), min(busy, key=_busy)
    spread = _busy(hi) - _busy(lo)
    if spread < th.gpu_imbalance:
        return []
    ev = tuple(
        gpu_evidence(s, "gpu_busy", s.busy, "ratio", source="nvml utilization") for s in busy
    ) + (th.evidence("gpu_imbalance", "busy_spread", round(spread, 4), "ratio", ">=", "nvml"),)
    msg = (
        f"The job's GPUs are unevenly loaded: GPU {hi.index} busy {hi.busy:.0%}, GPU "
        f"{lo.index} only {lo.busy:.0%}. The busiest sets the pace; the others wait."
    )
    actions = (
        "check that every rank gets the same batch size and sequence lengths "
        "(bucket or pad variable-length inputs)",
        "with DataParallel, switch to DistributedDataParallel (DataParallel gathers on GPU 0)",
        "look for work done only on rank 0 (logging, evaluation, saving)",
    )
    impact = spread * 0.5
    return [
        new_finding(
            "GPU004",
            th,
            confidence=NVML_ONLY_CONFIDENCE,
            impact=impact,
            message=msg,
            evidence=ev,
            recommendation=Recommendation("Balance the work across GPUs", actions),
            expected_speedup=speedup_from_impact(impact),
            signals=("nvml utilization",),
            speedup_basis=f"half the busy spread ({spread:.0%}) given back: the least loaded "
            "GPUs stop waiting for the busiest",
        )
    ]


def find(c: Context) -> list[Finding]:
    """The GPU findings over the loop window's per-GPU statistics, with those of gpu_transfer,
    gpu_memory (MEM001 points at the right-size line) and gpu_throttle; GPU idle the
    host-side findings made before it (`c.found`) leave unexplained is its own finding."""
    th, sizing = c.th, right_size_line(c.right_size)
    samples = int(c.profile.samples) if c.profile is not None else None
    out: list[Finding] = []
    for st in c.stats:
        own = transfer_findings(st, th, c.cp, c.metrics) + _launch(st, th)
        out += own + _tensor(st, th) + memory_findings(st, th, sizing) + throttle_findings(st, th)
        out += [blind(f, samples, th) for f in _idle(st, [*c.found, *own], th, c.cp)]
    return out + _imbalance(list(c.stats), th)


BLIND_CONFIDENCE = 0.5  # GPU001 with too few loop stacks to rule the host out: not sure


def blind(f: Finding, samples: int | None, th: Thresholds) -> Finding:
    """GPU001 says neither side explains the idle; with fewer loop stack samples than
    `stack_floor_samples` the host side is not ruled out: not sure, and it says so (a 16-core
    H100 box gave nanoGPT 0 loop samples and a sure GPU001 while evaluation held the loop)."""
    if samples is None or samples >= th.stack_floor_samples:
        return f
    ev = th.evidence("stack_floor_samples", "loop_stack_samples", samples, "samples", "<", "stacks")
    msg = (
        f"{f.message.split(', and neither side')[0]}, and the {samples} stack samples of "
        "the loop thread are too few to say which side holds it: the host's work (data, "
        "syncs, Python, evaluation) is not ruled out. Profile longer (--duration) or raise "
        "--cpu-budget."
    )
    return replace(
        f,
        confidence=min(f.confidence, BLIND_CONFIDENCE),
        message=msg,
        evidence=(*f.evidence, ev),
    )


FINDER = Finder("gpu", find, (GPU001, GPU002, GPU003, GPU004, MEM001, MEM002, THROT001, XFER001))
