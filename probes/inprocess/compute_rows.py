"""The agent's reading of the hooks' sampled steps (gpudiag_compute, in the job): one datagram's
"cmp" records turned into samples, every value checked as data (a malformed record is dropped,
never evaluated).

Sample kinds (all of probe "hooks"): `compute_step` (the step's forward, backward, optimizer
and model's own code; `counted` "1" on a step whose time the counting slowed), `module` (a
unit's forward and backward seconds, calls), `module_work` (a unit's FLOPs, bytes, ops,
parameters and dtype on a counted step), `param_group` (an optimizer group's tensors, elements,
bytes and update mode) and `gemm` (the job's largest matrix product: what the agent calibrates
the CPU on).
"""

from __future__ import annotations

import math

from gpudiag.probes.base import Field, Sample

FIELDS = (
    Field("cmp_step_s", "s", "gauge", "a sampled step's wall time"),
    Field("cmp_fwd_s", "s", "gauge", "the sampled step's model forwards"),
    Field("cmp_bwd_s", "s", "gauge", "the sampled step's backward calls"),
    Field("cmp_opt_s", "s", "gauge", "the sampled step's optimizer step"),
    Field("cmp_own_s", "s", "gauge", "forward time in the model outside its units"),
    Field("cmp_own_bwd_s", "s", "gauge", "backward time of the model's code between units"),
    Field("cmp_bare_s", "s", "gauge", "the mean wall time of the recent steps nothing timed"),
    Field("module_fwd_s", "s", "gauge", "a unit's forward time in a sampled step"),
    Field("module_bwd_s", "s", "gauge", "a unit's share of the backward in a sampled step"),
    Field("module_calls", "count", "gauge", "a unit's forward calls in a sampled step"),
    Field("work_flops_fwd", "FLOP", "gauge", "FLOPs in a place's forward (counted step)"),
    Field("work_flops_bwd", "FLOP", "gauge", "FLOPs in a place's backward (counted step)"),
    Field("work_flops_opt", "FLOP", "gauge", "FLOPs in the optimizer step (counted step)"),
    Field("work_bytes_fwd", "bytes", "gauge", "bytes its forward's ops read and wrote"),
    Field("work_bytes_bwd", "bytes", "gauge", "bytes its backward's ops read and wrote"),
    Field("work_bytes_opt", "bytes", "gauge", "bytes the optimizer's ops read and wrote"),
    Field("work_ops", "count", "gauge", "ops a place ran in the counted step"),
    Field("work_params", "count", "gauge", "parameters (elements) of a unit"),
    Field("work_io_bytes", "bytes", "gauge", "a layer's inputs, outputs and parameters (bytes)"),
    Field("inner_bytes", "bytes", "gauge", "a unit's part: its own forward ops' bytes"),
    Field("inner_io_bytes", "bytes", "gauge", "its inputs, outputs and own parameters (bytes)"),
    Field("inner_flops", "FLOP", "gauge", "its own forward ops' FLOPs"),
    Field("inner_s", "s", "gauge", "a unit's part: its own forward time in a sampled step"),
    Field("gemm_m", "count", "gauge", "the job's largest matrix product: rows"),
    Field("gemm_k", "count", "gauge", "the job's largest matrix product: inner size"),
    Field("gemm_n", "count", "gauge", "the job's largest matrix product: columns"),
    Field("group_tensors", "count", "gauge", "an optimizer group's tensors with a gradient"),
    Field("group_elems", "count", "gauge", "their elements"),
    Field("group_param_bytes", "bytes", "gauge", "their bytes"),
    Field("group_state_bytes", "bytes", "gauge", "their optimizer state's bytes"),
    Field("group_foreach", "ratio", "gauge", "1 when the group's update is foreach"),
    Field("group_fused", "ratio", "gauge", "1 when the group's update is fused"),
    Field("unit_unused", "ratio", "gauge", "share of a unit's outputs whose gradient is zero"),
    Field("unit_orphan", "count", "gauge", "its parameters' elements no optimizer updates"),
    Field("unit_repeat", "count", "gauge", "its calls on an input it already had in the step"),
    Field("unit_constant", "ratio", "gauge", "1: the same input as last sampled step, no grad"),
    Field(
        "unit_read_dim", "count", "gauge", "the dim of a unit's output along which one span is read"
    ),
    Field(
        "unit_read_start", "count", "gauge", "that span's first position (negative: from the end)"
    ),
    Field("unit_read_len", "count", "gauge", "that span's positions"),
    Field("group_zero_grad", "ratio", "gauge", "share of a group's gradient elements at zero"),
    Field("calib_rate", "1/s", "gauge", "the agent's calibration: FLOP/s (gemm) or B/s (copy)"),
)
MAX_RECORDS = 64
MAX_UNITS = 64
_STEP = (("step", "cmp_step_s"), ("fwd", "cmp_fwd_s"), ("bwd", "cmp_bwd_s"), ("opt", "cmp_opt_s"))
_WORK = (
    "work_flops_fwd",
    "work_flops_bwd",
    "work_flops_opt",
    "work_bytes_fwd",
    "work_bytes_bwd",
    "work_bytes_opt",
    "work_ops",
)
_GROUP = (
    "group_tensors",
    "group_elems",
    "group_param_bytes",
    "group_state_bytes",
    "group_foreach",
    "group_fused",
)


def _whole(v: object) -> float | None:
    """A whole number of either sign under 1e9 (a dim or a position from the end), else None."""
    if isinstance(v, bool) or not isinstance(v, int) or not -1e9 < v < 1e9:
        return None
    return float(v)


def _num(v: object) -> float | None:
    """A finite, non-negative number a float holds, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except (OverflowError, ValueError):
        return None
    return f if math.isfinite(f) and 0 <= f < 1e30 else None


def _label(v: object, limit: int = 120) -> str | None:
    return v[:limit] if isinstance(v, str) and v else None


def compute_samples(msg: dict) -> list[Sample]:
    """The samples of one datagram's sampled steps ("cmp")."""
    recs = msg.get("cmp")
    out: list[Sample] = []
    for rec in recs[:MAX_RECORDS] if isinstance(recs, list) else ():
        if isinstance(rec, dict):
            out += _record(rec)
    return out


def _record(rec: dict) -> list[Sample]:
    t = _num(rec.get("t"))
    if t is None or not 0 < t < 1e10:
        return []
    t_ns = int(t * 1e9)
    counted = "1" if rec.get("count") else "0"
    model = _label(rec.get("model")) or "model"
    values: dict[str, float | None] = {name: _num(rec.get(key)) for key, name in _STEP}
    if values["cmp_step_s"] is None:
        return []
    values["cmp_own_s"] = _num(rec.get("own"))
    if "own_bwd" in rec:  # (hooks before the own code's backward was cut out send none)
        values["cmp_own_bwd_s"] = _num(rec.get("own_bwd"))
    if "bare" in rec and not rec.get("count"):  # (hooks before bare steps were timed: none)
        values["cmp_bare_s"] = _num(rec.get("bare"))
    out = [
        Sample("hooks", t_ns, {"kind": "compute_step", "model": model, "counted": counted}, values)
    ]
    units = rec.get("units")
    for row in units[:MAX_UNITS] if isinstance(units, list) else ():
        if isinstance(row, list) and len(row) == 4 and _label(row[0]):
            f, b, n = (_num(v) for v in row[1:])
            if f is not None and b is not None and n is not None:
                labels = {"kind": "module", "module": row[0][:120], "counted": counted}
                vals: dict[str, float | None] = {
                    "module_fwd_s": f,
                    "module_bwd_s": b,
                    "module_calls": n,
                }
                out.append(Sample("hooks", t_ns, labels, vals))
    out += _work(rec, t_ns) + _groups(rec, t_ns) + _gemm(rec, t_ns) + _inner(rec, t_ns)
    return out + _why(rec, t_ns) + _group_zeros(rec, t_ns)


def _why(rec: dict, t_ns: int) -> list[Sample]:
    """A timed step's per-unit readings of work nobody needs or repeated (kind module_why)."""
    rows = rec.get("why")
    out = []
    for row in rows[:MAX_UNITS] if isinstance(rows, list) else ():
        if not isinstance(row, list) or len(row) not in (5, 8) or not _label(row[0]):
            continue
        unused, orphan, repeat, constant = (_num(v) for v in row[1:5])
        if unused is not None and unused > 1:
            unused = None
        if orphan is None or repeat is None or constant is None:
            continue
        vals: dict[str, float | None] = {
            "unit_unused": unused,
            "unit_orphan": orphan,
            "unit_repeat": repeat,
            "unit_constant": min(1.0, constant),
        }
        span = [_whole(v) for v in row[5:]]  # the span of its output the loss reads, if read
        if len(span) == 3 and all(v is not None for v in span):
            vals.update(
                zip(("unit_read_dim", "unit_read_start", "unit_read_len"), span, strict=True)
            )
        out.append(Sample("hooks", t_ns, {"kind": "module_why", "module": row[0][:120]}, vals))
    return out


# how a part's F.scaled_dot_product_attention ran (gpudiag_compute.SDPA_MARKS): its unfused
# math path, with dropout or without
FALLBACKS = ("sdpa_math", "sdpa_math_dropout")


def _inner(rec: dict, t_ns: int) -> list[Sample]:
    """A unit's part read apart: on a counted step, the part whose own forward ops move the
    most bytes over its inputs, outputs and own parameters (kind module_inner); on a timed
    step, the parts' own forward times (kind module_inner_time)."""
    out = []
    work = rec.get("inner")
    for row in work[:MAX_UNITS] if isinstance(work, list) else ():
        if not isinstance(row, list) or len(row) not in (5, 6):
            continue
        if not (_label(row[0]) and _label(row[1])):
            continue
        nums = [_num(v) for v in row[2:5]]
        if any(v is None for v in nums):
            continue
        labels = {"kind": "module_inner", "module": row[0][:120], "inner": row[1][:160]}
        if len(row) == 6 and row[5] in FALLBACKS:  # the part's SDPA fell back to its math path
            labels["fallback"] = row[5]
        vals = dict(zip(("inner_bytes", "inner_io_bytes", "inner_flops"), nums, strict=True))
        out.append(Sample("hooks", t_ns, labels, vals))
    times = rec.get("inner_s")
    for row in times[:MAX_UNITS] if isinstance(times, list) else ():
        if not isinstance(row, list) or len(row) != 3 or not (_label(row[0]) and _label(row[1])):
            continue
        own = _num(row[2])
        if own is None:
            continue
        labels = {"kind": "module_inner_time", "module": row[0][:120], "inner": row[1][:160]}
        out.append(Sample("hooks", t_ns, labels, {"inner_s": own}))
    return out


def _group_zeros(rec: dict, t_ns: int) -> list[Sample]:
    """A timed step's share of each optimizer group's gradient elements at zero."""
    rows = rec.get("gzero")
    out = []
    for row in rows[:16] if isinstance(rows, list) else ():
        if not isinstance(row, list) or len(row) != 3 or not _label(row[0], 8):
            continue
        share = _num(row[1])
        if share is None or share > 1:
            continue
        labels = {"kind": "param_group_grad", "group": row[0][:8], "param": _label(row[2]) or ""}
        out.append(Sample("hooks", t_ns, labels, {"group_zero_grad": share}))
    return out


def _work(rec: dict, t_ns: int) -> list[Sample]:
    rows = rec.get("work")
    out = []
    for row in rows[:MAX_UNITS] if isinstance(rows, list) else ():
        if not isinstance(row, list) or len(row) not in (11, 12) or not _label(row[0]):
            continue
        nums = [_num(v) for v in row[1:8]] + [_num(row[9])]
        if any(v is None for v in nums):
            continue
        labels = {
            "kind": "module_work",
            "module": row[0][:120],
            "dtype": _label(row[8], 20) or "",
            "top_ops": _label(row[10], 120) or "",
        }
        vals: dict[str, float | None] = dict(zip(_WORK, nums[:7], strict=True))
        vals["work_params"] = nums[7]
        if len(row) == 12:  # the unit's own inputs, outputs and parameters, in bytes
            vals["work_io_bytes"] = _num(row[11])
        out.append(Sample("hooks", t_ns, labels, vals))
    return out


def _groups(rec: dict, t_ns: int) -> list[Sample]:
    rows = rec.get("groups")
    out = []
    for row in rows[:16] if isinstance(rows, list) else ():
        if not isinstance(row, list) or len(row) != 9 or not _label(row[0], 8):
            continue
        nums = [_num(v) for v in row[1:7]]
        if any(v is None for v in nums):
            continue
        labels = {
            "kind": "param_group",
            "group": row[0][:8],
            "dtype": _label(row[7], 40) or "",
            "optimizer": _label(row[8], 60) or "",
        }
        out.append(Sample("hooks", t_ns, labels, dict(zip(_GROUP, nums, strict=True))))
    return out


def _gemm(rec: dict, t_ns: int) -> list[Sample]:
    g = rec.get("gemm")
    if not isinstance(g, list) or len(g) != 4 or not _label(g[0], 20):
        return []
    m, k, n = (_num(v) for v in g[1:])
    if m is None or k is None or n is None or min(m, k, n) < 1 or m * k * n > 1e13:
        return []
    device = _label(rec.get("device"), 10) or "cpu"
    labels = {"kind": "gemm", "dtype": g[0][:20], "device": device}
    return [Sample("hooks", t_ns, labels, {"gemm_m": m, "gemm_k": k, "gemm_n": n})]
