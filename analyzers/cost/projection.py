"""Right-sizing from the job's measured bound: a model of its speed and cost per unit of work
on each reference GPU model.

The measured step splits into the share the GPU idles (host work and waits: unchanged on
another GPU) and the GPU's busy time; the GPM counters split that busy time into
tensor-bound, memory-bound, FP32-compute-bound and the rest (SMs idle while a kernel is in
flight: launches, tiny kernels), each scaled by the matching datasheet ratio of the
candidate to the current model (dense bf16 TFLOPS, memory bandwidth, FP32 TFLOPS, unchanged).
Host and GPU time add up when the loop syncs each step or the GPU is the bound, and overlap
otherwise (the host side is the step); the band spans both and the GPU part +-BAND.
A model, not a measurement: labelled so wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpudiag.analyzers.cost.prices import MODELS, GpuModel, Price, by_key, identify, row_of
from gpudiag.analyzers.measures.critical_path import CriticalPath
from gpudiag.analyzers.measures.gpu_stats import GIB, GpuStats

BAND = 0.15  # the GPU-time part's uncertainty: activity counters and datasheet peaks
VRAM_MARGIN = 1.25  # a model must hold the measured peak VRAM +25%
SAME_SPEED = 0.9  # "within 10% of the current speed"
SYNCS_PER_STEP_SERIAL = 0.5  # a sync at least every other step: host and GPU time add up
GPU_BOUND_BUSY = 0.95  # a GPU this busy is the step's bound: its time scales
KIND = "model"
UNITS = {  # workload kind -> (unit, rate metric) tried in order
    "training": (("step", "steps_per_second"),),
    "server": (("request", "requests_per_second"),),
    "inference": (("item", "items_per_second"), ("batch", "forwards_per_second")),
}
GPM_SIGNALS = (
    ("sm_active", "gpm_sm_active (SM activity)"),
    ("tensor_active", "gpm_tensor_active (tensor-core activity)"),
    ("dram_bw", "gpm_dram_bw (DRAM bandwidth)"),
)
CLASSES = ("tensor", "memory", "compute", "latency")
RATIO_OF = {
    "tensor": "dense bf16 tensor TFLOPS",
    "memory": "memory bandwidth",
    "compute": "FP32 TFLOPS",
    "latency": "unchanged (launch and latency time)",
}


@dataclass(frozen=True)
class Prices:
    """The prices a projection may use: the run's own (`current`) and the user's table."""

    current: Price | None = None
    table: dict[str, float] = field(default_factory=dict)

    def of(self, m: GpuModel, is_current: bool) -> tuple[float, str] | None:
        """A model's USD per GPU-hour and where it came from."""
        if is_current and self.current is not None:
            return self.current.usd_per_gpu_hour, self.current.source
        for name, usd in self.table.items():
            if name.lower() in (m.key.lower(), m.label.lower()):
                return float(usd), f"user price table entry '{name}'"
        row = row_of(m.key)
        return (row.usd_per_gpu_hour, f"reference table, {row.date}") if row else None


@dataclass(frozen=True)
class Bound:
    """The measured step: the GPU's busy share, its busy time split by what bounds it
    (shares of busy time, summing to 1), and how host and GPU time combine."""

    gpu: float
    split: dict[str, float]
    serial: bool  # central model: host and GPU time add up (else they overlap)
    why: str

    def factor(self, g: float, serial: bool) -> float:
        """Step time on a GPU whose busy time is x`g`, relative to the measured step:
        serial, the host's share stays and the GPU's scales; overlapping, the host side is
        the whole step and the GPU's time only shows where it outgrows it."""
        if serial:
            return (1.0 - self.gpu) + self.gpu * g
        return max(1.0, self.gpu * g)


def missing_gpm(st: GpuStats) -> list[str]:
    """The GPM counters a bound needs that this GPU's samples lack."""
    return [name for attr, name in GPM_SIGNALS if getattr(st, attr) is None]


def bound_of(st: GpuStats, syncs_per_step: float | None) -> Bound:
    """The step's split from NVML utilisation and the GPM counters."""
    u = min(1.0, max(st.busy or 0.0, 1e-6))
    sm = min(1.0, (st.sm_active or 0.0) / u)
    tensor = min(sm, (st.tensor_active or 0.0) / u)
    memory = min(sm - tensor, (st.dram_bw or 0.0) / u)
    split = {
        "tensor": tensor,
        "memory": memory,
        "compute": sm - tensor - memory,
        "latency": 1.0 - sm,
    }
    if (syncs_per_step or 0.0) >= SYNCS_PER_STEP_SERIAL:
        return Bound(u, split, True, "serial: the loop syncs with the GPU each step")
    if u >= GPU_BOUND_BUSY:
        return Bound(u, split, True, f"GPU-bound (busy {u:.0%}): its time scales")
    return Bound(u, split, False, "overlapping: the host side is the step, the GPU runs under it")


def ratios(cand: GpuModel, cur: GpuModel) -> dict[str, float]:
    """Candidate over current, per bound, from the datasheets."""
    return {
        "tensor": cand.bf16_tflops / cur.bf16_tflops,
        "memory": cand.hbm_gb_s / cur.hbm_gb_s,
        "compute": cand.fp32_tflops / cur.fp32_tflops,
        "latency": 1.0,
    }


def speed_of(b: Bound, r: dict[str, float]) -> tuple[float, float, float]:
    """Relative speed (model) and its band on a GPU with datasheet ratios `r`."""
    g = sum(b.split[k] / r[k] for k in CLASSES)
    central = 1.0 / b.factor(g, b.serial)
    ends = [1.0 / b.factor(g * (1 + s * BAND), serial) for s in (-1, 1) for serial in (True, False)]
    return central, min(ends + [central]), max(ends + [central])


def unit_rate(metrics: dict, workload_kind: str | None) -> tuple[str, str, float | None]:
    """The unit of work, the metric its rate comes from and the rate (None: not measured)."""
    options = UNITS.get(workload_kind or "training", UNITS["training"])
    for unit, metric in options + UNITS["training"]:
        if metrics.get(metric):
            return unit, metric, float(metrics[metric])
    unit, metric = options[0]
    return unit, metric, None


def _per_1000(usd_h: float, n: int, rate: float | None, speed: float) -> float | None:
    return None if not rate else round(usd_h * n / (rate * speed * 3.6), 4)


def _row(
    m: GpuModel, cur: GpuModel, b: Bound, prices: Prices, n: int, rate: float | None
) -> dict | None:
    """One model's projected row (the current model's is the measured one)."""
    is_cur = m.key == cur.key
    price = prices.of(m, is_cur)
    if price is None:
        return None
    r = ratios(m, cur)
    speed, lo, hi = (1.0, 1.0, 1.0) if is_cur else speed_of(b, r)
    usd, source = price
    return {
        "model": m.key,
        "label": m.label,
        "measured": is_cur,
        "memory_gib": m.memory_gib,
        "usd_per_gpu_hour": usd,
        "price_source": source,
        "ratios": {k: round(v, 3) for k, v in r.items() if k != "latency"},
        "relative_speed": round(speed, 3),
        "relative_speed_band": [round(lo, 3), round(hi, 3)],
        "units_per_s": None if rate is None else round(rate * speed, 4),
        "usd_per_1000_units": _per_1000(usd, n, rate, speed),
        "usd_per_1000_units_band": (
            None if rate is None else [_per_1000(usd, n, rate, hi), _per_1000(usd, n, rate, lo)]
        ),
    }


HOST_CAUSES = {
    "data_wait": "input-bound",
    "checkpoint": "checkpoint-bound",
    "storage_io": "storage-bound",
    "h2d_copy": "transfer-bound",
    "gil_wait": "GIL-bound",
    "collective": "communication-bound",
}


def host_cause(cp: CriticalPath | None) -> str:
    """The host side's name for the GPU idle: its largest wait, else host-bound."""
    if cp is None or not cp.idle_by_wait:
        return "host-bound"
    wait = max(cp.idle_by_wait, key=lambda k: cp.idle_by_wait[k])
    if cp.idle_by_wait[wait] <= cp.host_bound + cp.sync_bubbles:
        return "host-bound"
    return HOST_CAUSES.get(wait, "host-bound")


def article(label: str) -> str:
    """'an' before a label read with a vowel sound (H100, L4, A100, RTX), else 'a'."""
    return "an" if label[:1] in "AEFHILMNORSX8" else "a"


def resolve_price(
    stats: list[GpuStats], override: Price | None, table: dict[str, float]
) -> Price | None:
    """The price to use: an explicit one, the user's table, else the reference table's row."""
    if override is not None:
        return override
    if not stats:
        return None
    model = identify(stats[0].name)
    for key in ([model.key] if model else []) + [stats[0].name, "default"]:
        for name, usd in table.items():
            if name.lower() == key.lower():
                return Price(
                    float(usd), f"user price table entry '{name}'", model.key if model else None
                )
    row = row_of(model.key) if model else None
    if model is None or row is None:
        return None
    return Price(
        row.usd_per_gpu_hour,
        f"built-in reference ({row.date}): {model.label}, {row.reference}; "
        f"{row.source.split(',')[0]}",
        model.key,
        row,
    )


def bound_name(b: Bound, host_cause: str) -> str:
    """What bounds the step: the host side or the GPU's largest class."""
    gpu = {k: b.gpu * v for k, v in b.split.items()}
    top = max(gpu, key=lambda k: gpu[k])
    if 1.0 - b.gpu >= gpu[top]:
        return host_cause
    return {
        "tensor": "tensor-bound",
        "memory": "memory-bandwidth-bound",
        "compute": "FP32-compute-bound (tensor cores idle)",
        "latency": "launch/latency-bound (SMs mostly idle while busy)",
    }[top]


def _basis(st: GpuStats, b: Bound, name: str) -> dict:
    return {
        "bound": name,
        "gpu_busy": round(b.gpu, 4),
        "host_share": round(1.0 - b.gpu, 4),
        "split_of_gpu_time": {k: round(v, 4) for k, v in b.split.items()},
        "counters": {
            "nvml_utilization": round(b.gpu, 4),
            "gpm_sm_active": round(st.sm_active or 0.0, 4),
            "gpm_tensor_active": round(st.tensor_active or 0.0, 4),
            "gpm_dram_bw": round(st.dram_bw or 0.0, 4),
        },
        "ratios": dict(RATIO_OF),
        "host_and_gpu": b.why,
        "band": f"host and GPU time serial or overlapping, GPU time +-{BAND:.0%}",
    }


def job_gpu(stats: list[GpuStats]) -> GpuStats | None:
    """The job's busiest GPU with a utilisation signal (it bounds a synchronous step)."""
    used = [s for s in stats if s.job_uses_gpu and s.busy is not None and not s.lost]
    return max(used, key=lambda s: s.busy or 0.0) if used else None


def _unavailable(reason: str, **more: Any) -> dict:
    return {"available": False, "kind": KIND, "reason": reason, **more}


def _no_gpm(st: GpuStats, missing: list[str]) -> dict:
    """Without GPM: the host share's effect only (no GPU model changes it), and no rows."""
    host = 1.0 - min(1.0, st.busy or 0.0)
    ceiling = None if host <= 0 else round(1.0 / host, 2)
    cap = f"; at most x{ceiling:g} faster on any GPU" if ceiling else ""
    return _unavailable(
        f"the job's bound on the GPU is not measured: missing {', '.join(missing)}",
        missing=missing,
        host_share=round(host, 4),
        ceiling=ceiling,
        statement=f"no right-size projection: missing {', '.join(missing)}; the GPU idles "
        f"{host:.0%} of the loop (host work and waits), which no GPU model changes{cap}",
    )


def project(
    stats: list[GpuStats],
    metrics: dict,
    workload_kind: str | None,
    prices: Prices,
    host_cause: str = "host-bound",
) -> dict:
    """The report's `right_size`: the job's speed and cost per unit on each reference model
    ({} for a job without a GPU)."""
    st = job_gpu(stats)
    if st is None:
        return {}  # no GPU: nothing to right-size (the cost section says why)
    key = prices.current.model if prices.current else None
    cur = (by_key(key) if key else None) or identify(st.name)
    if cur is None:
        return _unavailable(f"'{st.name}' is not in the reference table of GPU models")
    missing = missing_gpm(st)
    if missing:
        return _no_gpm(st, missing)
    b = bound_of(st, metrics.get("syncs_per_step"))
    unit, metric, rate = unit_rate(metrics, workload_kind)
    n = sum(1 for s in stats if s.job_uses_gpu and s.busy is not None)
    peak = max((s.mem_peak or 0.0) for s in stats) / GIB
    fits = [m for m in MODELS if m.key == cur.key or m.memory_gib >= peak * VRAM_MARGIN]
    rows = [r for m in fits if (r := _row(m, cur, b, prices, n, rate)) is not None]
    name = bound_name(b, host_cause)
    out = {
        "available": True,
        "kind": KIND,
        "current": cur.label,
        "gpus": n,
        "unit": unit,
        "rate_metric": metric,
        "rate": None if rate is None else round(rate, 4),
        "peak_vram_gib": round(peak, 2),
        "need_vram_gib": round(peak * VRAM_MARGIN, 2),
        "basis": _basis(st, b, name),
        "rows": rows,
        "note": "a model from datasheet ratios and the measured bound, with this box's CPUs "
        "(a host-bound job moves with its host: the same jobs ran 25-30% faster on an H200 "
        "box's CPUs); its GPU side held on H100 vs H200 (docs/cost.md), other models "
        "unverified; `gpudiag try` cannot measure it",
    }
    out.update(picks(rows, unit, name))
    return out


def _cheaper(rows: list[dict]) -> tuple[dict | None, list[dict]]:
    cur = next((r for r in rows if r["measured"]), None)
    if cur is None:
        return None, []
    return cur, [r for r in rows if not r["measured"]]


def picks(rows: list[dict], unit: str, bound: str) -> dict:
    """The cheapest model within 10% of the current speed, the cheapest per unit of work,
    and a line for each."""
    cur, others = _cheaper(rows)
    if cur is None:
        return {"same_speed": None, "per_unit": None, "statements": []}
    near = [r for r in others if r["relative_speed"] >= SAME_SPEED]
    same = min(near, key=lambda r: r["usd_per_gpu_hour"], default=None)
    if same is not None and same["usd_per_gpu_hour"] >= cur["usd_per_gpu_hour"]:
        same = None
    unit_cost = [(r["usd_per_gpu_hour"] / r["relative_speed"], r) for r in [cur, *others]]
    best = min(unit_cost, key=lambda x: x[0])[1]
    lines = [_same_line(cur, same, unit, bound), _unit_line(cur, best, unit)]
    return {
        "same_speed": None if same is None else same["model"],
        "per_unit": best["model"],
        "statements": lines,
    }


def _rate_text(r: dict, unit: str) -> str:
    if r["units_per_s"] is None:
        return f"x{r['relative_speed']:.2f} its speed"
    return f"{r['units_per_s']:.3g} {unit}s/s"


def _same_line(cur: dict, same: dict | None, unit: str, bound: str) -> str:
    if same is None:
        return (
            f"This job is {bound}: no cheaper reference GPU keeps it within 10% of its speed "
            f"on the {cur['label']} (model)"
        )
    lo, hi = same["relative_speed_band"]
    a = article(same["label"])
    return (
        f"This job is {bound}: {a} {same['label']} would run it at {_rate_text(same, unit)} "
        f"(x{same['relative_speed']:.2f}, band x{lo:.2f}-{hi:.2f}; model) for "
        f"${same['usd_per_gpu_hour']:.2f}/h instead of ${cur['usd_per_gpu_hour']:.2f}/h"
    )


def sure_saving(cur: dict, best: dict) -> bool:
    """Whether `best` is cheaper per unit of work than `cur` even at the slow end of its band."""
    slow = best["relative_speed_band"][0]
    return slow > 0 and best["usd_per_gpu_hour"] / slow < cur["usd_per_gpu_hour"]


def _unit_line(cur: dict, best: dict, unit: str) -> str:
    what = f"per 1,000 {unit}s" if best["usd_per_1000_units"] is not None else "per unit of work"
    if best is cur:
        return f"Cheapest {what}: the {cur['label']} it runs on (model)"
    if not sure_saving(cur, best):
        return (
            f"Cheapest {what}: {best['label']} by the model's central figure, but within its "
            f"band it may cost more than the {cur['label']}: not a sure saving"
        )
    if best["usd_per_1000_units"] is None:
        ratio = best["usd_per_gpu_hour"] / best["relative_speed"] / cur["usd_per_gpu_hour"]
        return f"Cheapest {what}: {best['label']}, x{ratio:.2f} the cost of the {cur['label']}"
    return (
        f"Cheapest {what}: {best['label']}, ${best['usd_per_1000_units']:.4g} vs "
        f"${cur['usd_per_1000_units']:.4g} on the {cur['label']} (model)"
    )


def right_size_line(right: dict | None) -> str | None:
    """The right-size line a finding points at: the cheapest model within 10% of the speed,
    else the cheapest per unit of work when that is not the current model."""
    if not right or not right.get("available"):
        return None
    lines = right.get("statements") or []
    if right.get("same_speed"):
        return lines[0]
    cur = next((r for r in right["rows"] if r["measured"]), None)
    best = next((r for r in right["rows"] if r["model"] == right.get("per_unit")), None)
    if cur is None or best is None or best is cur:
        return None
    # cheaper per unit even at the slow end of its band: else the model cannot tell
    return lines[1] if sure_saving(cur, best) else None
