"""Where a training step's compute goes, held against what the device attains: the hooks'
sampled steps (gpudiag_compute) read as one table, a row per unit of the model (its top
modules), the model's own code, the rest of the step, and the optimizer's parameter groups.

Each row's work is what the counted steps saw (FLOPs as torch.utils.flop_counter counts them,
the bytes its ops read and wrote); its time the timed steps' mean. Its roofline time is its
FLOPs at the attainable GEMM rate plus its bytes at the attainable copy bandwidth; its
efficiency, roofline time over measured time. The attainable rates: on a GPU the datasheet's
(gpu_table.json: bf16/fp16, TF32/fp32 peaks, memory bandwidth); on a CPU the agent's own short
calibration at the job's largest matrix product's size, or what the job's own best unit
reached when that is higher (a busy box slows the calibration too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpudiag.analyzers.timeline.timeline import Aggregate

OWN = "(model's own code)"
OUTSIDE = "(outside the model)"
OPT = "(optimizer)"
LOW_PRECISION = ("bfloat16", "float16")


@dataclass(frozen=True)
class Row:
    """One place of the step: a unit, the model's own code, outside the model, or an
    optimizer parameter group."""

    name: str
    kind: str  # unit, own, outside, optimizer
    fwd_s: float
    bwd_s: float
    share: float  # of the sampled steps' mean wall time
    flops_fwd: float | None = None
    flops_bwd: float | None = None
    bytes: float | None = None
    ops: float | None = None
    params: float | None = None
    dtype: str = ""
    calls: float | None = None
    roofline_s: float | None = None  # its work at the attainable rates
    top_ops: str = ""  # the ops it ran most, "name:count" (counted step)
    io_bytes: float | None = None  # its calls' inputs, outputs and parameters (counted step)
    group: dict = field(default_factory=dict)  # an optimizer group's tensors, bytes, mode
    why: dict = field(default_factory=dict)  # what its tensors show (timed steps' means):
    # unused (share of its outputs whose gradient is zero), orphan (its parameters' elements
    # given a gradient no optimizer updates), repeat (calls a step on an input it already had),
    # constant (share of timed steps on the last one's unchanged input, no grad); read_dim,
    # read_start, read_len: the one span of its output its gradient reaches (the rest unread)
    param_bytes: float | None = None  # an optimizer group's parameters' bytes (not reported)
    # a unit that calls others: its part whose own forward ops move the most bytes over what
    # it takes in and gives out: name, bytes, io (bytes), flops (counted steps' means), own_s
    # (its own forward seconds, the timed steps' mean; absent where none timed it), fallback
    # (its F.scaled_dot_product_attention ran the unfused math path: "sdpa_math", with dropout
    # "sdpa_math_dropout"; absent where it did not)
    inner: dict = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def flops(self) -> float | None:
        if self.flops_fwd is None or self.flops_bwd is None:
            return None
        return self.flops_fwd + self.flops_bwd

    @property
    def efficiency(self) -> float | None:
        if self.roofline_s is None or self.time_s <= 0:
            return None
        return min(1.0, self.roofline_s / self.time_s)

    def to_dict(self) -> dict:
        r = {
            "name": self.name,
            "kind": self.kind,
            "share": round(self.share, 4),
            "forward_s": round(self.fwd_s, 6),
            "backward_s": round(self.bwd_s, 6),
            "flops": None if self.flops is None else round(self.flops),
            "bytes": None if self.bytes is None else round(self.bytes),
            "ops": None if self.ops is None else round(self.ops),
            "params": None if self.params is None else round(self.params),
            "dtype": self.dtype or None,
            "achieved_flops_s": _rate(self.flops, self.time_s),
            "achieved_bytes_s": _rate(self.bytes, self.time_s),
            "efficiency": None if self.efficiency is None else round(self.efficiency, 4),
        }
        if self.calls is not None:
            r["calls"] = round(self.calls, 2)
        if self.top_ops:
            r["top_ops"] = self.top_ops
        if self.group:
            r["group"] = self.group
        if self.why:
            r["why"] = {k: round(v, 4) for k, v in self.why.items()}
        if self.inner:
            r["inner"] = {k: v if isinstance(v, str) else _round(v) for k, v in self.inner.items()}
        return r


def _round(v: float) -> float:
    return float(f"{v:.4g}")


def _rate(work: float | None, t: float) -> float | None:
    return None if work is None or t <= 0 else float(f"{work / t:.4g}")


@dataclass(frozen=True)
class Attainable:
    """What the device attains: GEMM FLOP/s and copy B/s for the job's dtype, and where from."""

    flops_s: float | None
    bytes_s: float | None
    dtype: str
    source: str  # "datasheet <GPU>", "calibration", "the job's best unit", or "" (unknown)


@dataclass(frozen=True)
class ComputeTable:
    """The sampled steps' table: the rows, the step's mean time, the attainable rates, and the
    step's model-FLOPs utilisation and roofline efficiency."""

    rows: tuple[Row, ...]
    step_s: float
    timed_steps: int
    counted_steps: int
    model: str
    dtype: str  # the dtype most of the job's FLOPs run in
    attainable: Attainable
    device: str
    # the mean wall time of the steps nothing timed, near the timed ones (None: hooks that
    # do not send it): a check that the timed steps, their hooks' own time taken out, stand
    # for the job's steps
    bare_s: float | None = None

    def unit_rows(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.kind in ("unit", "own"))

    @property
    def flops(self) -> float:
        return sum(r.flops or 0.0 for r in self.rows)

    @property
    def mfu(self) -> float | None:
        """The step's FLOPs at its wall time over the attainable GEMM rate."""
        peak = self.attainable.flops_s
        if not peak or self.step_s <= 0 or self.counted_steps == 0:
            return None
        return self.flops / self.step_s / peak

    @property
    def model_efficiency(self) -> float | None:
        """The model's (units, own code, optimizer) roofline time over their measured time."""
        rows = [r for r in self.rows if r.kind != "outside" and r.roofline_s is not None]
        t = sum(r.time_s for r in rows)
        if not rows or t <= 0:
            return None
        return min(1.0, sum(r.roofline_s or 0.0 for r in rows) / t)

    @property
    def model_share(self) -> float:
        return sum(r.share for r in self.rows if r.kind != "outside")

    def to_dict(self) -> dict:
        a = self.attainable
        mfu, eff = self.mfu, self.model_efficiency
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "step_s": round(self.step_s, 6),
            "timed_steps": self.timed_steps,
            "counted_steps": self.counted_steps,
            **({} if self.bare_s is None else {"bare_step_s": round(self.bare_s, 6)}),
            "flops_per_step": round(self.flops),
            "mfu": None if mfu is None else round(mfu, 4),
            "model_efficiency": None if eff is None else round(eff, 4),
            "attainable": {
                "flops_s": None if a.flops_s is None else float(f"{a.flops_s:.4g}"),
                "bytes_s": None if a.bytes_s is None else float(f"{a.bytes_s:.4g}"),
                "dtype": a.dtype,
                "source": a.source,
            },
            "rows": [r.to_dict() for r in self.rows],
        }


def _mean(view: Aggregate, name: str, **labels: str) -> dict[str, float]:
    """Per module label: the mean of one field over the matching series."""
    out: dict[str, tuple[float, int]] = {}
    for lab, r in view.matching("hooks", name, **labels):
        key = lab.get("module") or lab.get("group") or ""
        tot, n = out.get(key, (0.0, 0))
        out[key] = (tot + r.total, n + r.count)
    return {k: tot / n for k, (tot, n) in out.items() if n}


def _work(view: Aggregate) -> dict[str, dict]:
    """Per place: its counted work (means over the counted steps) and dtype."""
    out: dict[str, dict] = {}
    for name in (
        "work_flops_fwd",
        "work_flops_bwd",
        "work_flops_opt",
        "work_bytes_fwd",
        "work_bytes_bwd",
        "work_bytes_opt",
        "work_ops",
        "work_params",
        "work_io_bytes",
    ):
        for lab, r in view.matching("hooks", name, kind="module_work"):
            if r.count:
                d = out.setdefault(lab.get("module", ""), {"dtype": lab.get("dtype", "")})
                d[name] = r.total / r.count
                if lab.get("top_ops"):
                    d["top_ops"] = lab["top_ops"]
    return out


def _best_calibration(view: Aggregate, op: str, dtype: str) -> float | None:
    best = None
    for lab, r in view.matching("hooks", "calib_rate", kind="calibration", op=op):
        if lab.get("dtype") == dtype and r.count and r.maximum > 0:
            best = r.maximum if best is None else max(best, r.maximum)
    return best


def _job_dtype(work: dict[str, dict]) -> str:
    flops: dict[str, float] = {}
    for d in work.values():
        f = d.get("work_flops_fwd", 0.0) + d.get("work_flops_bwd", 0.0)
        if d.get("dtype"):
            flops[d["dtype"]] = flops.get(d["dtype"], 0.0) + f
    return max(flops, key=lambda k: flops[k]) if flops else "float32"


def _counted(view: Aggregate) -> int:
    """The counted steps (their work read; their time not) a view holds."""
    rows = view.matching("hooks", "cmp_step_s", kind="compute_step", counted="1")
    return int(sum(r.count for _, r in rows))


# the job's GPU's datasheet rates for a dtype (None: a GPU the table does not know)
Datasheet = Callable[[str], "Attainable | None"]


def compute_table(
    view: Aggregate, datasheet: Datasheet | None = None, whole: Aggregate | None = None
) -> ComputeTable | None:
    """The table of the hooks' sampled steps; None without timed sampled steps. `datasheet`:
    the job's GPU's rates (None: a CPU job, calibrated by the agent); `whole`: the whole run,
    where the calibration is read (a property of the device, not of the window)."""
    steps = view.matching("hooks", "cmp_step_s", kind="compute_step", counted="0")
    n = sum(r.count for _, r in steps)
    if not n:
        return None
    step_s = sum(r.total for _, r in steps) / n
    if step_s <= 0:
        return None
    counted, src = _counted(view), view
    if whole is not None and _counted(whole) > counted:
        # the look's first counted steps fell before its window (start-up, the loop's first
        # seconds): a model's work per step is the same all run long, so the run's counts
        # stand for the window's
        counted, src = _counted(whole), whole
    model = steps[0][0].get("model", "model")
    step = {
        k: (lambda rs: sum(r.total for _, r in rs) / max(1, sum(r.count for _, r in rs)))(
            view.matching("hooks", k, kind="compute_step", counted="0")
        )
        for k in ("cmp_fwd_s", "cmp_bwd_s", "cmp_opt_s", "cmp_own_s", "cmp_own_bwd_s")
    }
    fwd = _mean(view, "module_fwd_s", kind="module", counted="0")
    bwd = _mean(view, "module_bwd_s", kind="module", counted="0")
    calls = _mean(view, "module_calls", kind="module", counted="0")
    work = _work(src)
    dtype = _job_dtype(work)
    device = "cpu" if datasheet is None else "cuda"
    rows = _rows(step, step_s, fwd, bwd, calls, work)
    rows += _groups(view, step.get("cmp_opt_s") or 0.0, step_s, work.get(OPT, {}))
    rows = _with_inner(src, view, _with_why(view, rows))
    att = _attainable(whole or view, datasheet, dtype, rows)
    rows = [_with_roofline(r, att) for r in rows]
    bare = [r for _, r in view.matching("hooks", "cmp_bare_s", kind="compute_step", counted="0")]
    nb = sum(r.count for r in bare)
    bare_s = sum(r.total for r in bare) / nb if nb else None
    return ComputeTable(tuple(rows), step_s, n, counted, model, dtype, att, device, bare_s)


def _rows(step: dict, step_s: float, fwd: dict, bwd: dict, calls: dict, work: dict) -> list[Row]:
    rows = []
    for name in fwd:
        w = work.get(name, {})
        rows.append(_row(name, "unit", fwd[name], bwd.get(name, 0.0), step_s, w, calls.get(name)))
    unit_bwd = sum(bwd.get(n, 0.0) for n in fwd)
    own_fwd = step.get("cmp_own_s") or 0.0
    own_bwd = step.get("cmp_own_bwd_s") or 0.0
    unit_bwd += own_bwd
    rows.append(_row(OWN, "own", own_fwd, own_bwd, step_s, work.get(OWN, {})))
    model_s = sum(r.time_s for r in rows) + (step.get("cmp_opt_s") or 0.0)
    loss_bwd = max(0.0, (step.get("cmp_bwd_s") or 0.0) - unit_bwd)
    rest = max(0.0, step_s - model_s - loss_bwd)
    rows.append(_row(OUTSIDE, "outside", rest, loss_bwd, step_s, work.get(OUTSIDE, {})))
    return rows


def _row(  # noqa: PLR0913 (a row is its fields)
    name: str, kind: str, f: float, b: float, step_s: float, w: dict, calls: float | None = None
) -> Row:
    has = bool(w)
    return Row(
        name,
        kind,
        f,
        b,
        (f + b) / step_s,
        w.get("work_flops_fwd") if has else None,
        w.get("work_flops_bwd") if has else None,
        (w.get("work_bytes_fwd", 0.0) + w.get("work_bytes_bwd", 0.0)) if has else None,
        w.get("work_ops") if has else None,
        w.get("work_params") if has else None,
        w.get("dtype", ""),
        calls,
        top_ops=w.get("top_ops", ""),
        io_bytes=w.get("work_io_bytes") if has else None,
    )


def _groups(view: Aggregate, opt_s: float, step_s: float, opt_work: dict) -> list[Row]:
    """The optimizer step per parameter group, its time split by the bytes each group's update
    touches (its parameters, their gradients and its state)."""
    names = (
        "group_tensors",
        "group_elems",
        "group_param_bytes",
        "group_state_bytes",
        "group_foreach",
        "group_fused",
    )
    groups: dict[str, dict] = {}
    for name in names:
        for lab, r in view.matching("hooks", name, kind="param_group"):
            if r.count:
                g = groups.setdefault(lab.get("group", "0"), {"dtype": lab.get("dtype", "")})
                g[name] = r.total / r.count
                g["optimizer"] = lab.get("optimizer", "")
    if not groups or opt_s <= 0:
        return []
    weight = {
        k: 2 * g.get("group_param_bytes", 0.0) + g.get("group_state_bytes", 0.0)
        for k, g in groups.items()
    }
    total = sum(weight.values()) or 1.0
    opt_bytes = opt_work.get("work_bytes_opt")
    rows = []
    for k, g in sorted(groups.items()):
        part = weight[k] / total
        rows.append(
            Row(
                f"{OPT} group {k}",
                "optimizer",
                0.0,
                opt_s * part,  # counted as its time (it is neither forward nor backward)
                opt_s * part / step_s,
                0.0 if opt_work else None,
                0.0 if opt_work else None,
                None if opt_bytes is None else opt_bytes * part,
                None if "work_ops" not in opt_work else opt_work["work_ops"] * part,
                g.get("group_elems"),
                g.get("dtype", ""),
                group={
                    "optimizer": g.get("optimizer", ""),
                    "tensors": round(g.get("group_tensors", 0.0)),
                    "state_bytes": round(g.get("group_state_bytes", 0.0)),
                    "foreach": bool(g.get("group_foreach")),
                    "fused": bool(g.get("group_fused")),
                },
                param_bytes=g.get("group_param_bytes"),
            )
        )
    return rows


WHY = (
    "unit_unused",
    "unit_orphan",
    "unit_repeat",
    "unit_constant",
    "unit_read_dim",
    "unit_read_start",
    "unit_read_len",
)
_INNER = ("inner_bytes", "inner_io_bytes", "inner_flops")


def _with_inner(counted: Aggregate, timed: Aggregate, rows: list[Row]) -> list[Row]:
    """Each unit's part read apart (see Row.inner): its work from the counted steps (`counted`),
    its own forward time from the timed ones (`timed`)."""
    parts: dict[tuple[str, str], dict[str, float]] = {}
    fallback: dict[tuple[str, str], str] = {}  # a part whose SDPA ran its math path
    for name in _INNER:
        for lab, r in counted.matching("hooks", name, kind="module_inner"):
            if r.count:
                key = (lab.get("module", ""), lab.get("inner", ""))
                parts.setdefault(key, {})[name.removeprefix("inner_")] = r.total / r.count
                if lab.get("fallback"):
                    fallback[key] = lab["fallback"]
    own: dict[tuple[str, str], tuple[float, int]] = {}
    for lab, r in timed.matching("hooks", "inner_s", kind="module_inner_time"):
        key = (lab.get("module", ""), lab.get("inner", ""))
        tot, n = own.get(key, (0.0, 0))
        own[key] = (tot + r.total, n + r.count)
    best: dict[str, dict] = {}
    for (unit, name), w in parts.items():
        if len(w) < len(_INNER) or w["io_bytes"] <= 0:
            continue
        nums = {"bytes": w["bytes"], "io": w["io_bytes"], "flops": w["flops"]}
        tot, n = own.get((unit, name), (0.0, 0))
        if n:
            nums["own_s"] = tot / n
        old = best.get(unit)
        if old is None or nums["bytes"] / nums["io"] > old["bytes"] / old["io"]:
            best[unit] = {"name": name, **nums}
            if (unit, name) in fallback:
                best[unit]["fallback"] = fallback[(unit, name)]
    return [
        replace(row, inner=best[row.name]) if row.kind == "unit" and row.name in best else row
        for row in rows
    ]


def _with_why(view: Aggregate, rows: list[Row]) -> list[Row]:
    """Each unit's readings of work nobody needs or repeated, and each optimizer group's share
    of zero gradient elements (with the parameter holding most of them), as the timed steps'
    means."""
    units: dict[str, dict[str, float]] = {}
    for name in WHY:
        for lab, r in view.matching("hooks", name, kind="module_why"):
            if r.count:
                units.setdefault(lab.get("module", ""), {})[name.removeprefix("unit_")] = (
                    r.total / r.count
                )
    zeros: dict[str, tuple[float, int, str]] = {}
    for lab, r in view.matching("hooks", "group_zero_grad", kind="param_group_grad"):
        if r.count:
            g = lab.get("group", "0")
            tot, n, _ = zeros.get(g, (0.0, 0, ""))
            zeros[g] = (tot + r.total, n + r.count, lab.get("param", ""))
    out = []
    for row in rows:
        if row.kind == "unit" and row.name in units:
            row = replace(row, why=units[row.name])
        elif row.kind == "optimizer" and row.group:
            g = row.name.rsplit(" ", 1)[-1]
            if g in zeros:
                tot, n, param = zeros[g]
                row = replace(row, group={**row.group, "zero_grad": round(tot / n, 4)})
                if param:
                    row = replace(row, group={**row.group, "zero_param": param})
        out.append(row)
    return out


def _attainable(
    view: Aggregate, datasheet: Datasheet | None, dtype: str, rows: list[Row]
) -> Attainable:
    if datasheet is not None:
        return datasheet(dtype) or Attainable(None, None, dtype, "")
    gemm = _best_calibration(view, "gemm", dtype)
    copy = _best_calibration(view, "copy", dtype)
    best = max(
        (r.flops / r.time_s for r in rows if r.kind == "unit" and r.flops and r.time_s > 0),
        default=None,
    )
    source = "calibration" if gemm else ""
    if best is not None and (gemm is None or best > gemm):
        gemm, source = best, "the job's best unit" + (" (above the calibration)" if gemm else "")
    moved = max(
        (r.bytes / r.time_s for r in rows if r.kind == "unit" and r.bytes and r.time_s > 0),
        default=None,
    )
    if moved is not None and (copy is None or moved > copy):
        copy = moved  # a busy box slows the copy's calibration more than the job's own passes
    return Attainable(gemm, copy, dtype, source)


def _with_roofline(r: Row, a: Attainable) -> Row:
    if r.bytes is None or r.flops is None or not a.bytes_s or not a.flops_s:
        return r
    return replace(r, roofline_s=r.flops / a.flops_s + r.bytes / a.bytes_s)
