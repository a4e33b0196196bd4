"""XFER001: host-to-device copies stall the loop (pageable sources, a saturated PCIe link)."""

from __future__ import annotations

from gpudiag.analyzers.measures.critical_path import CriticalPath
from gpudiag.analyzers.measures.gpu_stats import GpuStats, confidence, gpu_evidence
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Recommendation,
    speedup_from_impact,
    speedup_from_step,
)
from gpudiag.analyzers.model.thresholds import Thresholds

XFER001 = register(
    Spec(
        "XFER001",
        "Host-to-device copies stall the loop",
        "transfer",
        True,
        time_in="h2d_copy",
        reads=("gpu_idle",),
        doc=Doc(
            means=(
                "host-to-device copies stall the loop: copies from pageable memory (hooks), or a "
                "PCIe link near capacity"
            ),
            fix=(
                "`pin_memory=True` + `non_blocking=True`, keep static data on the GPU, uint8 "
                "transfer; flags a down-trained link"
            ),
            measured=(
                Measured(
                    impact="GPU idle during host-to-device copies",
                    speedup=(
                        "the copy phase at `pinned_link_efficiency` (80%) of the link instead of "
                        "the pageable rate measured"
                    ),
                    checked="x5.5 / x6.3-6.6",
                ),
            ),
        ),
    )
)


def transfer_findings(
    st: GpuStats, th: Thresholds, cp: CriticalPath, metrics: dict
) -> list[Finding]:
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
    ev = [
        th.evidence(
            "h2d_copy_warn",
            "h2d_copy_share",
            round(copy_share, 4),
            "ratio",
            ">=" if copy_share >= th.h2d_copy_warn else "<",
            "in-process hooks",
        )
    ]
    if pinned is not None:
        ev.append(
            Evidence("h2d_pinned_ratio", round(pinned, 4), "ratio", source="in-process hooks")
        )
    if cap is not None:
        ev.append(
            gpu_evidence(
                st,
                "pcie_rx_share_of_link",
                rx / cap,
                "ratio",
                threshold=th.pcie_saturation,
                comparison=">=" if near else "<",
                setting="pcie_saturation",
                source="nvml pcie counters",
            )
        )
        ev.append(gpu_evidence(st, "pcie_rx", rx / 1e9, "GB/s", source="nvml pcie counters"))
        ev.append(
            gpu_evidence(
                st,
                "pcie_link",
                cap / 1e9,
                "GB/s",
                source=f"gen{st.pcie_gen:.0f} x{st.pcie_width:.0f}",
            )
        )
    ev.append(gpu_evidence(st, "gpu_busy", busy, "ratio", source="nvml utilization"))
    link = ""
    if (
        st.pcie_gen_max
        and st.pcie_gen
        and st.pcie_gen < st.pcie_gen_max
        or (st.pcie_width_max and st.pcie_width and st.pcie_width < st.pcie_width_max)
    ):
        link = (
            f" The link runs at gen{st.pcie_gen:.0f} x{st.pcie_width:.0f} but supports "
            f"gen{st.pcie_gen_max:.0f} x{st.pcie_width_max:.0f}: check the slot/riser."
        )
    if stalls:
        # the copy phase of the loop, made at the rate pinned memory reaches on this link
        impact = copy
        rate_now = rx / copy_share if copy_share > 0 else rx
        pinned_rate = th.pinned_link_efficiency * cap if cap else None
        if pageable and pinned_rate and rate_now > 0 and rate_now < pinned_rate:
            after = (1.0 - copy_share) + copy_share * rate_now / pinned_rate
            speed = speedup_from_step(after)
            speed_kind = "model"
            basis = (
                f"the copy phase ({copy_share:.0%} of the step at {rate_now / 1e9:.1f} "
                f"GB/s from pageable memory) at {pinned_rate / 1e9:.0f} GB/s pinned "
                f"({th.pinned_link_efficiency:.0%} of the link), the rest unchanged"
            )
        else:
            speed = speedup_from_impact(copy)
            basis = f"a bound: x{speed:.2f} if the copies overlapped compute entirely"
            speed_kind = "bound"
        kind = "from pageable (unpinned) host memory" if pageable else "on the loop's path"
        msg = (
            f"The loop spends {copy_share:.0%} of its time in host-to-device copies {kind}; "
            f"GPU {st.index} idles {copy:.0%} of the loop waiting for them (the link carries "
            f"{rx / 1e9:.1f} GB/s" + (f" of {cap / 1e9:.0f} GB/s" if cap else "") + ")." + link
        )
        actions = (
            "pin the source: DataLoader(..., pin_memory=True), or tensor.pin_memory() "
            "once for data reused every step",
            "copy with .to('cuda', non_blocking=True) so the copy overlaps compute",
            "or keep data that does not change on the GPU instead of copying it each step",
            "send uint8 images and convert/normalise on the GPU (4x fewer bytes than fp32)",
        )
        summary = (
            "Pinned memory and non_blocking copies"
            if pageable
            else "Overlap the copies, send fewer bytes"
        )
    else:
        assert cap is not None  # not stalls, so near: the link's capacity is known
        impact = 0.0 if busy >= th.pcie_busy_max else min(0.99, 1.0 - busy)
        speed = speedup_from_impact(impact)
        basis = (
            "the link is the bound: fewer bytes per step is the only way up"
            if impact == 0
            else f"a bound: x{speed:.2f} if the GPU never waited for the link"
        )
        speed_kind = "bound"
        msg = (
            f"GPU {st.index} receives {rx / 1e9:.1f} GB/s over a {cap / 1e9:.1f} GB/s link "
            f"({rx / cap:.0%}): host-to-device bandwidth is the bound for this job." + link
        )
        actions = (
            "DataLoader(..., pin_memory=True) and .to('cuda', non_blocking=True) so the "
            "copies overlap compute instead of preceding it",
            "send fewer bytes: uint8 instead of fp32 (4x), compressed or cropped inputs",
            "keep data that does not change on the GPU instead of copying it each step",
            "do augmentation on the GPU (torchvision.transforms.v2 on CUDA tensors, DALI)",
        )
        summary = "Move fewer bytes over PCIe"
    return [
        new_finding(
            "XFER001",
            th,
            note=impact < th.h2d_copy_warn,
            confidence=confidence(st, 0.7),
            impact=min(0.99, impact),
            message=msg,
            evidence=tuple(ev),
            recommendation=Recommendation(summary, actions),
            expected_speedup=speed,
            signals=("nvml pcie counters", "in-process hooks"),
            speedup_basis=basis,
            speedup_kind=speed_kind,
        )
    ]
