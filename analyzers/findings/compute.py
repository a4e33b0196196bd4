"""COMP001: a part of the training step (a top module of the model, the model's own code, the
step's ops outside the model, an optimizer parameter group) takes a large share of the step and
runs far below what the rest of the model attains for its work, with the reason read from the
job: its FLOPs' dtype, its backward's FLOPs against its forward's, its op count and the ops it
runs, its calls a step, its optimizer group's update mode (measures/compute.py's table)."""

from __future__ import annotations

import statistics

from gpudiag.analyzers.context.context import Context
from gpudiag.analyzers.context.finder import Finder
from gpudiag.analyzers.measures.compute import ComputeTable, Row
from gpudiag.analyzers.measures.module_split import OwnCall, own_call
from gpudiag.analyzers.model.catalogue import Doc, Measured, Spec, new_finding, register
from gpudiag.analyzers.model.results import (
    Evidence,
    Finding,
    Recommendation,
    speedup_from_impact,
)
from gpudiag.analyzers.model.thresholds import Thresholds

COMP001 = register(
    Spec(
        "COMP001",
        "A part of the step costs far more than its work",
        "host",
        False,
        None,  # a warning at most: what the named change gives back is measured by try
        note_title="A part of the step runs far below the rest of the model, no reason read",
        # its place's time is the model's ops (host time on a CPU, a loop of small ops' launches
        # on a GPU): HOST001 takes its impact off the host-bound share, LOOP001 runs after it
        claims=("loop_time", "loop_host_time", "compute"),
        doc=Doc(
            means=(
                "a part of a training step (a top module of the model, the model's own code, "
                "the step's ops outside the model, an optimizer parameter group), timed by the "
                "hooks on a sampled step every 2 s, takes `comp_share_warn` (0.15) or more of the"
                " step and either runs at `comp_efficiency_ratio` (0.25) or less of the "
                "efficiency the rest of the model attains (its FLOPs and bytes, counted on a "
                "look's first 2 sampled steps, then one every 4 s or more, at the attainable "
                "rates over its time), or its work shows why it "
                "costs more than it needs: float64 FLOPs in a float32 model, a backward of "
                "`comp_recompute_ratio` (2.6) times its forward's FLOPs or more (recomputation),"
                " `comp_ops_min` (200) ops a step or more at 10x the median unit's (a Python "
                "loop over items; in a module, ops of a quarter of the other units' size or "
                "less, or 4 calls a step or more: a deep stack's full-size ops are depth; never "
                "the optimizer's, whose ops follow its tensors), on a GPU a per-tensor optimizer "
                "over 20 tensors or more, a layer (a module that calls no other) whose ops "
                "move 16x or more the bytes its inputs, outputs and parameters need over a "
                "forward and a backward (an intermediate far larger than its result), or a part"
                " of a module that calls others (its attention, a product inside a block) whose"
                " own forward ops move 16x or more what it takes in and gives out; or, "
                "read on the timed steps from its tensors: 0.75 or more of its outputs at a zero "
                "gradient (computed, never read; in a shallow module, under 100 ops a step), "
                "parameters given a gradient that no optimizer "
                "updates, a second call on an input it already had in the step, the same "
                "unchanged input every step with no gradient (a constant recomputed), an "
                "optimizer group whose gradient elements are 0.75 or more zero; under "
                "`gpudiag run`, `instrument()` or `attach --hooks`, in a training loop. With no "
                "reason read it is a note, and a verdict of no bottleneck beside it is not sure"
            ),
            fix=(
                "names the module or group and the change its work calls for: compute it in "
                "the model's dtype; drop activation checkpointing where the activations fit; "
                "one batched op in place of a loop of small ones (torch.vmap); only the outputs "
                "that are read; requires_grad_(False) on what does not train; the first output "
                "reused; a constant computed once; foreach=True "
                "(fused=True on a GPU) in the optimizer; with no reason read, a profiler "
                "capture of the step (`--capture-steps`) shows its ops. Carries the `gpudiag "
                "try` trial that measures the change where one acts from outside the code: "
                "freeze:UNIT, reuse:UNIT, recompute_off, select:UNIT:dim=D,start=S,length=L "
                "(the span of its output the loss reads: positions, or a Linear's features), "
                "batched:UNIT (a unit a loop calls once per sample), cache:MODULE.FUNCTION (the "
                "helper of the model's own code with a loop, named from the stacks)"
            ),
            measured=(
                Measured(
                    impact=(
                        "its share of the step times the share of its time the change gives back: "
                        "half for float64 and a per-tensor optimizer, (r - 2) / (r + 1) for a "
                        "backward at r times its forward's FLOPs, 1 - the median unit's ops over "
                        "its ops for a loop (a bound where the loop, outside any module, runs ops "
                        "as large as the units': its time is their bytes, and what the batched "
                        "form's own ops cost is not read), the unread share for unread outputs or "
                        "zero gradients, its backward for gradients no optimizer takes, the "
                        "repeated calls' share, all of it for a constant, a part's own forward time"
                        " beyond its FLOPs at the rate of the rest of its module's forward for a "
                        "part's intermediates, or its time over its twins' (same FLOPs and "
                        "parameters, without the reason) where that is more; summed over every "
                        "place that shows the same reason, whatever its share (outputs unread at "
                        "the same span as the named place's, upstream of it, left out: its change "
                        "leaves them); with what the change gives back outside the place: half the "
                        "optimizer's update of a float64 module's parameters, the update of the "
                        "zero-gradient parameters of a module whose outputs nobody reads and the "
                        "zero gradient a selection after it writes over them (once, at the "
                        "attainable copy rate), the weight gradients of a module frozen for a "
                        "group's zero gradients"
                    ),
                    speedup=(
                        "a model: 1 / (1 - impact); the places' times are the timed steps' "
                        "with the hooks' own time (their bodies, on a CPU on the job's thread) "
                        "taken out"
                    ),
                    variant="a reason read from its work",
                ),
                Measured(
                    impact=(
                        "its share of the step times 1 - its efficiency over the rest of the "
                        "model's"
                    ),
                    speedup="a bound: the place at the rest of the model's efficiency",
                    variant="no reason read",
                ),
            ),
        ),
    )
)

LOW = ("bfloat16", "float16")

# (what the job shows, the change that follows, the share of its place's time the change gives
# back, the reason's kind: float64, recompute, loop, unused, orphan, repeat, constant,
# zero_grad, intermediates, foreach)
Reason = tuple[str, str, float, str]


def reference(t: ComputeTable, row: Row) -> float | None:
    """The efficiency of the model's units other than `row` (their roofline time over their
    measured time): what the job's own work attains on this device."""
    rows = [r for r in t.rows if r.kind == "unit" and r is not row and r.roofline_s is not None]
    time = sum(r.time_s for r in rows)
    if time <= 0:
        return None
    return min(1.0, sum(r.roofline_s or 0.0 for r in rows) / time)


# What a reason's fix gives back, as a share of its place's time (a model, stated with it):
FP64_SAVING = 0.5  # float64 GEMMs at half the float32 rate (a CPU's vector width; GPUs less)
FOREACH_SAVING = 0.5  # one kernel per tensor and step against a few for the whole group
# A unit's outputs (or an optimizer group's gradient elements) read as unused from this share
# at zero gradient: a ReLU after a unit zeroes about half, dropout its rate; a head over every
# position with the loss at the last, or a layer sliced to a sixteenth, 0.99 and 0.94.
UNUSED_SHARE = 0.75


# ops a step above which a module is deep (a stack of layers): its unread outputs say little of
# its cost (a Linear head runs 5-10 forward and backward, a 4-layer BERT encoder 339)
SHALLOW_OPS = 100


def waste(row: Row) -> list[Reason]:
    """Reasons read from a unit's tensors and parameters (work nobody needs, work repeated)
    and from an optimizer group's gradients; see `reasons`."""
    out: list[Reason] = []
    w, g = row.why, row.group
    unused = w.get("unused")
    # a deep module's unread outputs save its last stage only (BERT's encoder: the positions
    # its pooler leaves; its earlier layers feed the one read): read in a shallow one only
    shallow = row.ops is None or row.ops < SHALLOW_OPS
    if unused is not None and unused >= UNUSED_SHARE and shallow:
        out.append(
            (
                f"{unused:.0%} of its outputs get a zero gradient or reach no loss: it computes "
                "what nobody reads",
                "compute only the outputs that are read: select them before this module (e.g. "
                "head(x[:, -1]) in place of head(x)[:, -1]), narrow it to the part read, or "
                "drop an output no loss uses",
                unused,
                "unused",
            )
        )
    orphan = w.get("orphan") or 0.0
    if orphan >= 1 and row.bwd_s > 0 and row.time_s > 0:
        out.append(
            (
                f"its backward computes gradients for {orphan:,.0f} parameter elements that no "
                "optimizer updates",
                "freeze them: requires_grad_(False) on its parameters (or run it under "
                "torch.no_grad() where nothing before it trains)",
                row.bwd_s / row.time_s,
                "orphan",
            )
        )
    repeat = w.get("repeat") or 0.0
    if repeat >= 0.5 and row.calls:
        out.append(
            (
                f"{repeat:.0f} of its {row.calls:.0f} calls a step run on an input it already "
                "had in the same step: it computes the same output again",
                "keep its first output and reuse it (a second forward of the same batch for an "
                "auxiliary loss or a metric repeats the work)",
                min(1.0, repeat / row.calls),
                "repeat",
            )
        )
    if (w.get("constant") or 0.0) >= 0.5:
        out.append(
            (
                "it runs on the same unchanged input on every sampled step with no gradient: "
                "its output is the same each step",
                "compute it once before the loop and reuse the result (again only when its "
                "input changes)",
                1.0,
                "constant",
            )
        )
    zero = g.get("zero_grad") if row.kind == "optimizer" else None
    if zero is not None and zero >= UNUSED_SHARE:
        out.append(
            (
                f"{zero:.0%} of the gradient elements it updates are zero (most in "
                f"{g.get('zero_param') or 'its largest tensor'}): parameters no loss reached "
                "this step, updated anyway",
                "freeze what is meant to stay fixed (requires_grad_(False): no gradient, no "
                "update), or give an embedding sparse gradients (nn.Embedding(sparse=True) "
                "with torch.optim.SparseAdam)",
                zero,
                "zero_grad",
            )
        )
    return out


def reasons(row: Row, t: ComputeTable, th: Thresholds) -> list[Reason]:
    """(what the job shows, the change that follows, the share of the place's time it gives
    back) for a row, each read from its work."""
    out: list[Reason] = []
    if row.dtype == "float64" and t.dtype != "float64" and row.flops:
        out.append(
            (
                f"its {row.flops:.3g} FLOPs a step run in float64 while the rest of the model "
                f"computes in {t.dtype}",
                f"compute it in {t.dtype}: drop the .double() / dtype=torch.float64 of its "
                "parameters and inputs (float64 matrix products run at half the float32 rate "
                "on a CPU and at 1/2-1/30 of it on a GPU)",
                FP64_SAVING,
                "float64",
            )
        )
    if row.kind == "unit" and row.flops_fwd and row.flops_bwd is not None:
        ratio = row.flops_bwd / row.flops_fwd
        if ratio >= th.comp_recompute_ratio:
            out.append(
                (
                    f"its backward does {ratio:.1f}x its forward's FLOPs (a backward's own work "
                    "is 2x): it recomputes its forward in the backward (activation "
                    "checkpointing)",
                    "drop torch.utils.checkpoint (or gradient_checkpointing) where the "
                    "activations fit in memory: it trades a forward's compute for memory",
                    (ratio - 2.0) / (ratio + 1.0),
                    "recompute",
                )
            )
    others = [r.ops for r in t.rows if r.kind == "unit" and r is not row and r.ops]
    typical = statistics.median(others) if others else 0.0
    # many ops against the other units' (none: a whole model's forward in one unit, TRL's
    # Qwen2 read "1460 ops where the model's units run a median 0: a Python loop", x9.5)
    many = bool(others) and row.ops is not None and row.ops >= th.comp_ops_min
    many = many and row.ops is not None and row.ops >= 10 * typical
    if many and row.ops is not None and _small_ops(row, t):
        per_op = (row.bytes or 0.0) / row.ops
        calls = f", called {row.calls:.0f} times a step" if row.calls and row.calls > 1 else ""
        out.append(
            (
                f"it runs {row.ops:.0f} ops a step ({per_op / 1024:.1f} KiB each on average"
                f"{calls}; most: {row.top_ops or 'not recorded'}), where the model's units run "
                f"a median {typical:.0f}: a Python loop over items or elements",
                "vectorise it: one batched op over the whole batch in place of a loop of small "
                "ones (torch's batched forms, torch.vmap)",
                1.0 - max(typical, 1.0) / row.ops,
                "loop",
            )
        )
    out += waste(row) + _intermediates(row)
    g = row.group
    # on a GPU only: a launch per tensor is what foreach saves; on a CPU foreach Adam ran at
    # half the for-loop's speed (20 tensors of 512x512 and less, one thread, 2026-11-28)
    gpu = t.device == "cuda"
    if gpu and row.kind == "optimizer" and g and not g.get("foreach") and not g.get("fused"):
        if g.get("tensors", 0) >= 20:
            out.append(
                (
                    f"its {g.get('optimizer') or 'optimizer'} updates {g['tensors']} tensors "
                    "one at a time (foreach and fused off)",
                    "foreach=True (or fused=True on a GPU) in the optimizer's constructor",
                    FOREACH_SAVING,
                    "foreach",
                )
            )
    return out


# a module's ops move this many times the bytes a direct form needs (IO_PASSES passes over its
# inputs, outputs and parameters: a forward and a backward's two): intermediates far larger
# than what it reads and writes (a Linear, a conv, a LayerNorm, an encoder: 0.6-3; a product by
# broadcast and sum, 39)
IO_AMPLIFY = 16.0
IO_PASSES = 3.0


INTERMEDIATES_FIX = (
    "compute it without the large intermediate: one matrix product or einsum in place "
    "of a broadcast and a reduction (x @ W, not (x[:, :, None] * W).sum(1)), a fused "
    "kernel (F.scaled_dot_product_attention) in place of written-out scores"
)


def _intermediates(row: Row) -> list[Reason]:
    """A layer (a module that calls no other) whose ops move far more bytes than its inputs, outputs
    and parameters hold: the same result through an intermediate far larger than the result.
    In a unit that calls others, the same of its part read apart (`_inner_intermediates`)."""
    if row.kind != "unit" or not row.bytes:
        return []
    if not row.io_bytes:  # the sampler reads a layer's (a module that calls no other) alone
        return _inner_intermediates(row)
    ratio = row.bytes / (IO_PASSES * row.io_bytes)
    if ratio < IO_AMPLIFY:
        return []
    return [
        (
            f"its ops move {row.bytes / 2**20:,.1f} MiB a step, {ratio:.0f}x what its inputs, "
            f"outputs and parameters need ({IO_PASSES * row.io_bytes / 2**20:,.2f} MiB over a "
            "forward and a backward): it builds intermediates far larger than its result",
            INTERMEDIATES_FIX,
            1.0 - 1.0 / ratio,
            "intermediates",
        )
    ]


def _inner_intermediates(row: Row) -> list[Reason]:
    """A part of a unit (its attention, a product inside a block) whose own forward ops (those
    of the modules it calls left out) move IO_AMPLIFY times or more the bytes it takes in and
    gives out (its inputs, outputs and own parameters, one pass: the forward's). What the change
    gives back of the unit's time: the part's own forward time beyond what its FLOPs take at
    the rate the rest of the unit's forward runs (the fused form still does the products),
    over the unit's forward time (its backward taken to follow); none without its time."""
    part = row.inner
    if not part or part.get("io", 0.0) <= 0 or row.fwd_s <= 0:
        return []
    ratio = part["bytes"] / part["io"]
    own = part.get("own_s")
    if ratio < IO_AMPLIFY or own is None:
        return []
    rest_s = row.fwd_s - own
    rest_flops = (row.flops_fwd or 0.0) - part.get("flops", 0.0)
    needed = part.get("flops", 0.0) * rest_s / rest_flops if rest_s > 0 and rest_flops > 0 else 0.0
    saving = min(0.9, max(0.0, own - needed) / row.fwd_s)
    if saving <= 0:
        return []
    why, fix = _fallback(part.get("fallback"))
    return [
        (
            f"its part {part['name']} runs ops that move {part['bytes'] / 2**20:,.1f} MiB a "
            f"forward, {ratio:.0f}x what it takes in and gives out "
            f"({part['io'] / 2**20:,.2f} MiB: its inputs, outputs and own parameters), "
            f"{own * 1e3:.1f} ms of the unit's {row.fwd_s * 1e3:.1f} ms forward: it builds "
            "intermediates far larger than its result" + why,
            fix,
            saving,
            "intermediates",
        )
    ]


def _fallback(how: object) -> tuple[str, str]:
    """(what the part's ops say of its attention, the change): a part that already calls
    F.scaled_dot_product_attention, which ran its unfused math path (written-out scores), is
    told how to get the fused kernel, not told to call it."""
    if how == "sdpa_math_dropout":
        return (
            "; it already calls F.scaled_dot_product_attention, which ran its unfused math "
            "path (scores, softmax and a dropout mask written out): attention dropout keeps "
            "it off the fused kernel (on a CPU no fused kernel takes dropout)",
            "attention dropout 0 in training lets scaled_dot_product_attention run fused "
            "(dropout_p=0.0; Hugging Face: attention_probs_dropout_prob=0.0 or "
            "attention_dropout=0.0 in the model's config): a change to the training's "
            "regularisation, to weigh against its accuracy",
        )
    if how == "sdpa_math":
        return (
            "; it already calls F.scaled_dot_product_attention, which ran its unfused math "
            "path (scores and softmax written out): its inputs keep it off the fused kernels",
            "give scaled_dot_product_attention inputs a fused kernel takes (with "
            "torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION) it raises and says "
            "why): no or a boolean mask, is_causal for a causal mask, a head size and dtype "
            "the kernel supports (fp16/bf16 on a GPU)",
        )
    return "", INTERMEDIATES_FIX


# calls of one module in one step that are a loop over items (a forward per sample)
LOOP_CALLS = 4


def _small_ops(row: Row, t: ComputeTable) -> bool:
    """Whether `row`'s ops are small against the other units' (bytes an op at most a quarter
    of their median) where `row` is a module: a loop over items in it runs many small ops, a
    deep encoder many full-size ones (a Hugging Face *ForSequenceClassification's encoder
    runs 200+ ops a step beside a dropout and a head of one or two: no loop). Unknown bytes:
    the count alone decides."""
    if row.kind == "optimizer":
        return False  # its ops follow its tensors (a for-loop Adam: ~9 a tensor), no items
    peers = [r for r in t.rows if r.kind == "unit" and r is not row and r.ops]
    if _called_in_a_loop(row, t):
        return True  # called over and over in one step, more than its peers: a loop calls it
    if row.kind != "unit" or not row.ops or not row.bytes:
        return True  # the model's own code or the loop's: no module's structure to hold it to
    sizes = [r.bytes / r.ops for r in peers if r.bytes and r.ops]
    if not sizes:
        return True
    return row.bytes / row.ops <= 0.25 * statistics.median(sizes)


def _called_in_a_loop(row: Row, t: ComputeTable) -> bool:
    """Whether a unit is called LOOP_CALLS times a step or more over its peers' calls (a loop
    over items calls it: a forward per sample)."""
    if row.kind != "unit":
        return False
    peers = [r for r in t.rows if r.kind == "unit" and r is not row and r.ops]
    return (row.calls or 0.0) >= LOOP_CALLS * _median_calls(peers)


def _median_calls(peers: list[Row]) -> float:
    """The calls a step of the other units (at least 1): a step of gradient accumulation calls
    every module once per micro-batch (TRL's sft.py README: 8), a loop over items one module
    once per item; with no other unit the count cannot tell them apart (infinite)."""
    if not peers:
        return float("inf")
    return max(1.0, statistics.median([r.calls or 1.0 for r in peers]))


def spread(action: str, t: ComputeTable, th: Thresholds, named: Row | None = None) -> float:
    """The share of the step a change gives back across every place whose work shows the
    reason it names (a checkpoint on every block, not only the costliest): at each, the larger
    of the reason's model and its time's excess over its twins that do the same work without
    the reason (a float64 block against its float32 twins: the casts it forces inside it
    counted), and what the change gives back beyond the place (`beyond`). Outputs nobody
    reads at the same span as the `named` place's (a norm and a layer before a head over every
    position, their gradients zero where the head's are) are that place's unread outputs seen
    upstream: the change there (a selection before it) leaves their work as it was."""
    total, extra = 0.0, dict[str, float]()
    span = read_span(named) if named is not None else None
    for row in t.rows:
        found = [(r[2], r[3]) for r in reasons(row, t, th) if r[1] == action]
        if not found or row.time_s <= 0:
            continue
        if span is not None and row is not named and read_span(row) == span:
            continue
        saving, kind = max(found)
        total += row.share * max(saving, _excess(row, action, t, th))
        key, share = beyond(row, kind, t)
        extra[key] = max(extra.get(key, 0.0), share)  # one module's backward counted once
    return total + sum(extra.values())


# bytes an element of a dtype (a unit's "float32,float64": its widest)
ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
# a backward of at most this many times its forward's FLOPs computes no input gradient (a
# first layer's: its weight gradient alone, 1x; with the input's, 2x)
WEIGHT_ONLY_BWD = 1.5


def beyond(row: Row, kind: str, t: ComputeTable) -> tuple[str, float]:
    """(what it is, its share of the step): what a change to a place's parameters gives back
    outside the place. The optimizer updates those parameters too: half their update for
    float64 (its bytes halve), the update of the parameter elements at zero gradient for a
    module whose outputs nobody reads (narrowed to the part read, they go); and a module frozen
    for an optimizer group's zero gradients no longer computes its weight gradients (its
    backward, all of it where its input takes none)."""
    if kind == "float64":
        return f"{row.name} update", FP64_SAVING * _update_share(row, t)
    if kind == "unused":
        share = _update_share(row, t) * _zero_params(row, t) + _zero_fill(row, t)
        return f"{row.name} update", share
    if kind == "zero_grad":
        unit = _frozen_unit(row, t)
        if unit is None or unit.time_s <= 0:
            return row.name, 0.0
        fwd, bwd = unit.flops_fwd or 0.0, unit.flops_bwd or 0.0
        weights = 1.0 if bwd <= WEIGHT_ONLY_BWD * fwd else 0.5
        return f"{unit.name} backward", unit.share * unit.bwd_s / unit.time_s * weights
    return row.name, 0.0


def _zero_fill(row: Row, t: ComputeTable) -> float:
    """The share of the step the selection after a unit spends writing its output's zero
    gradient (autograd's backward of an index or a slice writes a gradient of the whole output,
    zeros where it is unread): its unread share of its output's bytes (its inputs', outputs' and
    parameters' bytes less its parameters') once at the attainable copy rate; only where the
    hooks read the one span its gradient reaches (a selection), none without the rate."""
    if read_span(row) is None or not row.io_bytes or not t.attainable.bytes_s or t.step_s <= 0:
        return 0.0
    size = max((ITEMSIZE[d] for d in row.dtype.split(",") if d in ITEMSIZE), default=4)
    out = max(0.0, row.io_bytes / max(1.0, row.calls or 1.0) - (row.params or 0.0) * size)
    unread = out * (row.why.get("unused") or 0.0) * max(1.0, row.calls or 1.0)
    return min(1.0, unread / t.attainable.bytes_s / t.step_s)


def _update_share(row: Row, t: ComputeTable) -> float:
    """The share of the step the optimizer spends on a unit's parameters: their bytes over the
    bytes of every group's parameters (the state follows them), of the optimizer's share."""
    groups = [r for r in t.rows if r.kind == "optimizer"]
    held = sum(r.param_bytes or 0.0 for r in groups)
    if row.kind != "unit" or not row.params or held <= 0:
        return 0.0
    size = max((ITEMSIZE[d] for d in row.dtype.split(",") if d in ITEMSIZE), default=4)
    return sum(r.share for r in groups) * min(1.0, row.params * size / held)


def _zero_params(row: Row, t: ComputeTable) -> float:
    """The share of a unit's parameter elements at zero gradient: the zero elements of each
    optimizer group whose most zeros lie in the unit."""
    zero = sum(
        (r.group.get("zero_grad") or 0.0) * (r.params or 0.0)
        for r in t.rows
        if r.kind == "optimizer" and str(r.group.get("zero_param") or "").startswith(row.name + ".")
    )
    return min(1.0, zero / row.params) if row.params else 0.0


def _frozen_unit(row: Row, t: ComputeTable) -> Row | None:
    """The unit a freeze of an optimizer group's zero gradients names (its trial's target)."""
    fix = trial(row)
    target = fix["target"] if fix and fix["kind"] == "freeze" else None
    return next((r for r in t.rows if r.kind == "unit" and r.name == target), None)


def _excess(row: Row, action: str, t: ComputeTable, th: Thresholds) -> float:
    """The share of `row`'s time above the median time of its twins (units of the same FLOPs,
    within 1%, and parameters) whose work does not show the reason; 0 without twins."""
    if not row.flops or row.kind != "unit":
        return 0.0
    twins = [
        r.time_s
        for r in t.rows
        if r is not row
        and r.kind == "unit"
        and r.flops
        and abs(r.flops - row.flops) <= 0.01 * row.flops
        and r.params == row.params
        and action not in {x[1] for x in reasons(r, t, th)}
    ]
    if not twins:
        return 0.0
    return max(0.0, 1.0 - statistics.median(twins) / row.time_s)


def trial(row: Row, th: Thresholds | None = None) -> dict | None:
    """The `gpudiag try` fix that measures a reason `waste` read, where one applies from
    outside the code: freeze the module whose gradients nobody takes (or that holds a group's
    zero gradients), reuse the output of a module called again on the same input; with the
    thresholds, activation checkpointing off where a unit recomputes its forward; the unit
    over only the span of its output the loss reads, where the hooks read one (select)."""
    w, g = row.why, row.group
    if row.kind == "unit" and (w.get("orphan") or 0.0) >= 1:
        return {"kind": "freeze", "target": row.name, "values": {}}
    if row.kind == "unit" and ((w.get("repeat") or 0.0) >= 0.5 or (w.get("constant") or 0) >= 0.5):
        return {"kind": "reuse", "target": row.name, "values": {}}
    span = read_span(row)
    # positions, or a Linear's features (the layer narrowed, in the optimizer too)
    if row.kind == "unit" and (w.get("unused") or 0.0) >= UNUSED_SHARE and span is not None:
        return {"kind": "select", "target": row.name, "values": span}
    param = str(g.get("zero_param") or "")
    if row.kind == "optimizer" and (g.get("zero_grad") or 0.0) >= UNUSED_SHARE and "." in param:
        return {"kind": "freeze", "target": param.rsplit(".", 1)[0], "values": {}}
    if th is not None and row.kind == "unit" and row.flops_fwd and row.flops_bwd is not None:
        if row.flops_bwd / row.flops_fwd >= th.comp_recompute_ratio:
            return {"kind": "recompute_off", "values": {}}
    return None


def fix_arg(fix: dict) -> str:
    """A trial as `gpudiag try --fix` takes it: KIND[:TARGET][:KEY=VALUE,...]."""
    values = ",".join(f"{k}={v}" for k, v in (fix.get("values") or {}).items())
    return ":".join(x for x in (fix["kind"], fix.get("target") or "", values) if x)


def read_span(row: Row) -> dict | None:
    """The span of a unit's output the loss reads, as the select trial takes it ({dim, start,
    length}), where every timed step read the same one (its means are whole numbers); else
    None."""
    got = [row.why.get(k) for k in ("read_dim", "read_start", "read_len")]
    if any(v is None or abs(v - round(v)) > 1e-6 for v in got):
        return None
    dim, start, length = (int(round(v or 0.0)) for v in got)
    return {"dim": dim, "start": start, "length": length} if length >= 1 else None


def _candidates(
    t: ComputeTable, th: Thresholds, outside: bool = True
) -> list[tuple[float, Row, float | None, float | None]]:
    """(impact, row, its efficiency, the reference) of each row far below the reference or
    whose work shows a reason it costs more than it needs (its impact: the larger of the two
    models); `outside`: whether the step's ops outside the model may be one."""
    out: list[tuple[float, Row, float | None, float | None]] = []
    for row in t.rows:
        if row.kind == "outside" and not outside:
            continue
        eff = row.efficiency
        if row.share < th.comp_share_warn:
            continue
        ref = reference(t, row)
        saving = max((r[2] for r in reasons(row, t, th)), default=0.0)
        if eff is None or ref is None or ref <= 0:  # no counted work: a reason read alone
            if saving > 0:
                out.append((row.share * saving, row, None, None))
            continue
        far = eff <= th.comp_efficiency_ratio * ref
        if row.kind == "outside" and (row.ops or 0) < th.comp_ops_min:
            far = False  # the loop's own Python and data wait: the stacks' findings say where
        if not far and saving <= 0:
            continue
        impact = row.share * max(saving, 1.0 - eff / ref if far else 0.0)
        out.append((impact, row, eff, ref))
    # a place whose work shows why first: a reason read from the job before a bound alone
    return sorted(out, key=lambda x: (not reasons(x[1], t, th), -x[0]))


Candidate = tuple[float, Row, float | None, float | None]


def _holder_first(found: list[Candidate], t: ComputeTable, th: Thresholds) -> list[Candidate]:
    """An optimizer group first whose zero gradients lie mostly in a unit that computes
    outputs nobody reads is that unit's cause seen from its update (a layer 16x wider than the
    part read: its unread outputs' weight rows get zero gradients): the unit goes first, whose
    change (narrowing it) also ends that update (`beyond`). Which of the two led turned on the
    optimizer's timed share: `over_wide` read `(optimizer) group 0` in one look, `inp` in the
    next."""
    if not found or found[0][1].kind != "optimizer":
        return found
    if "zero_grad" not in {r[3] for r in reasons(found[0][1], t, th)}:
        return found
    param = str(found[0][1].group.get("zero_param") or "")
    for i, x in enumerate(found[1:], 1):
        holds = x[1].kind == "unit" and param.startswith(x[1].name + ".")
        if holds and "unused" in {r[3] for r in reasons(x[1], t, th)}:
            return [x, *found[:i], *found[i + 1 :]]
    return found


def _evidence(
    row: Row, eff: float | None, ref: float | None, t: ComputeTable, th: Thresholds
) -> tuple:
    share = th.evidence(
        "comp_share_warn", "compute_share", round(row.share, 4), "ratio", ">=", "hooks"
    )
    if eff is None or ref is None:  # a reason read from its tensors, no counted work
        return (share, *_why_evidence(row))
    vs = round(eff / ref, 4)
    ev = [
        share,
        th.evidence(
            "comp_efficiency_ratio", "compute_efficiency_vs_model", vs, "ratio", "<=", "hooks"
        )
        if vs <= th.comp_efficiency_ratio
        else Evidence("compute_efficiency_vs_model", vs, "ratio", source="hooks"),
        Evidence("compute_efficiency", round(eff, 5), "ratio", source="hooks"),
        Evidence("model_efficiency", round(ref, 5), "ratio", source="hooks"),
    ]
    if row.flops is not None:
        ev.append(Evidence("compute_flops", round(row.flops), "FLOP", source="hooks"))
    if row.ops is not None:
        ev.append(Evidence("compute_ops", round(row.ops), "count", source="hooks"))
    if t.attainable.flops_s:
        ev.append(
            Evidence(
                "attainable_flops_s",
                float(f"{t.attainable.flops_s:.4g}"),
                "FLOP/s",
                source=t.attainable.source or "hooks",
            )
        )
    return (*ev, *_why_evidence(row))


def _why_evidence(row: Row) -> tuple[Evidence, ...]:
    """What a unit's tensors or a group's gradients showed, where `waste` read a reason."""
    if not waste(row):
        return ()
    vals = {**row.why, **{k: v for k, v in row.group.items() if k == "zero_grad"}}
    unit = {"unused": "ratio", "orphan": "count", "repeat": "count", "constant": "ratio"}
    return tuple(
        Evidence(f"compute_{k}", round(v, 4), unit.get(k, "ratio"), source="hooks")
        for k, v in sorted(vals.items())
        if v and not k.startswith("read_")  # the read span: the trial's values
    )


def large_ops(row: Row, t: ComputeTable) -> bool:
    """Whether a loop outside any module (the model's own code, the step's) runs ops as large
    as the units' (bytes an op at their median or more). A loop of small ops spends its time on
    their count, which one batched op gives back; a loop of large ones spends it on their
    bytes, and what the batched form's own ops cost over the same data is not read here
    (prefix_mean's running mean, 6 MiB an op against its units' 2.5 MiB: the loop given back
    modelled x8-x9, its cumulative sum's 14 ops over (batch, time, width) timed bare x3.4-x4.8):
    what the loop's time bounds is then a bound."""
    if row.kind == "unit" or not row.ops or not row.bytes:
        return False
    peers = [r.bytes / r.ops for r in t.rows if r.kind == "unit" and r.bytes and r.ops]
    return bool(peers) and row.bytes / row.ops >= statistics.median(peers)


def _calls_note(row: Row, impact: float) -> str:
    """A unit called over and over in a step (a forward per sample): its calls' time given back
    is a bound, for one batched call still does their work (sample_loop.py's encoder: modelled
    x6.5-x20 with its calls given back, its batched call timed bare x6.0)."""
    work = f" ({row.flops / 1e6:,.0f} MFLOP a step)" if row.flops else ""
    return (
        f"a bound: {impact:.0%} of the step, its {row.calls or 0:.0f} calls a step given back "
        f"but one; one batched call still does their work{work}, which is not timed here"
    )


def _large_note(row: Row, t: ComputeTable, impact: float) -> str:
    peers = [r.bytes / r.ops for r in t.rows if r.kind == "unit" and r.bytes and r.ops]
    return (
        f"a bound: {impact:.0%} of the step, the loop given back but the median unit's ops; its "
        f"ops are as large as the units' ({(row.bytes or 0) / (row.ops or 1) / 1024:,.0f} KiB an "
        f"op against their median {statistics.median(peers) / 1024:,.0f} KiB): its time is "
        "their bytes, and what one batched form's own ops cost over the same data is not read"
    )


def _own_call(c: Context) -> OwnCall | None:
    """The helper of the job's own that most of the model's own code runs in, from the loop's
    stacks (None without them: a context of the hooks' table alone)."""
    view, profile, clf = (getattr(c, k, None) for k in ("view", "profile", "clf"))
    if view is None or profile is None or clf is None:
        return None
    return own_call(view, profile, clf)


def find(c: Context) -> list[Finding]:
    """COMP001 over the hooks' sampled steps (one finding: the costliest place, the others
    named in its message)."""
    t, th = c.compute, c.th
    if t is None:
        return []
    # the step outside the model holds the input pipeline where the loop loads its own
    # batches (num_workers=0, or waits for them): its ops are the loading's, which the data
    # findings name (a planted DataLoader wait read COMP001 "1,574 ops outside the model")
    loading = c.profile.share("data_wait") + c.profile.share("storage_io")
    found = _holder_first(_candidates(t, th, outside=loading < th.comp_share_warn), t, th)
    if not found:
        return []
    impact, row, eff, ref = found[0]
    why = reasons(row, t, th)
    same = [x for x in found[1:] if why and why[0][1] in {r[1] for r in reasons(x[1], t, th)}]
    if why:  # one cause across the step: every place that shows it, whatever its share
        impact = min(0.95, max(impact, spread(why[0][1], t, th, row)))
    found = [found[0], *same, *[x for x in found[1:] if x not in same]]
    where = {
        "unit": f"module {row.name}",
        "own": row.name,
        "outside": row.name,
        "optimizer": row.name,
    }[row.kind]
    shown = (
        "; ".join(r[0] for r in why)
        if why
        else (
            "its FLOPs, bytes, dtype and ops look ordinary: what it does that its work does not "
            "show is not read here (a profiler capture of the step shows its ops)"
        )
    )
    more = "".join(
        f"; also {r.name} ({r.share:.0%} of the step"
        + (f", {e / f:.0%} of the model's efficiency)" if e is not None and f else ")")
        for _, r, e, f in found[1:3]
    )
    rate = ""
    if eff is not None and ref and not (waste(row) and eff > th.comp_efficiency_ratio * ref):
        rate = (
            f" and runs at {eff / ref:.1%} of the efficiency the rest of {t.model} attains on "
            f"this device ({eff:.2%} against {ref:.2%} of the "
            f"{t.attainable.source.removeprefix('the ') or 'attainable'} rates)"
        )
    message = (
        f"{where} takes {row.share:.0%} of the training step ({row.time_s * 1e3:.1f} ms of "
        f"{t.step_s * 1e3:.1f} ms){rate}: {shown}{more}."
    )
    actions = tuple(r[1] for r in why) or (
        f"time {row.name} alone (gpudiag run --capture-steps 5 shows its ops)",
    )
    fix = trial(row, th) if why else None
    looped = bool(why) and why[0][3] == "loop" and _called_in_a_loop(row, t)
    large = bool(why) and why[0][3] == "loop" and (looped or large_ops(row, t))
    if fix is None and _called_in_a_loop(row, t) and any(r[3] == "loop" for r in why):
        # a loop over samples calling the unit: one batched call (checked as it runs)
        fix = {"kind": "batched", "target": row.name, "values": {}}
    call = None
    if fix is None and row.kind == "own" and any(r[3] == "loop" for r in why):
        call = _own_call(c)  # the helper its own code's time is in
        fix = {"kind": "cache", "target": call.target, "values": {}} if call else None
    if call is not None and fix is not None:
        actions += (
            f"where {call.function} ({call.share:.0%} of the model's own code) is called with "
            "the same arguments every step, compute it once; measure it first (its hit rate "
            f"says whether they repeat): gpudiag try --fix {fix_arg(fix)} -- <the job>",
        )
    elif fix is not None:
        arg = fix_arg(fix)
        actions += (f"measure it first: gpudiag try --fix {arg} -- <the job>",)
    return [
        new_finding(
            "COMP001",
            th,
            # no reason read: what it costs is a bound and no change is named, so a note (the
            # verdict is then not sure, and says where to look)
            note=not why,
            detail=f"({row.name})",
            confidence=min(0.95, 0.6 + 0.05 * t.timed_steps),
            impact=impact,
            message=message,
            evidence=_evidence(row, eff, ref, t, th),
            recommendation=Recommendation(
                f"Make {row.name} do its work at the model's rate", actions
            ),
            expected_speedup=speedup_from_impact(impact),
            fix=fix,
            signals=("hooks",),
            speedup_basis=(
                _calls_note(row, impact)
                if looped
                else _large_note(row, t, impact)
                if large
                else f"a model: {impact:.0%} of the step given back by the change named"
                if why
                else f"a bound: {row.name} at the rest of the model's efficiency "
                f"({row.share:.0%} of the step down to {row.share * (eff or 0) / (ref or 1):.1%})"
            ),
            speedup_kind="model" if why and not large else "bound",
        )
    ]


FINDER = Finder("compute", find, (COMP001,))
