"""`gpudiag try --fix batched:UNIT`: a module called once per sample, on slices of one batch,
computed once on the whole batch, its slices handed to the calls (inside the job; imports
nothing from gpudiag).

A loop over a batch (`[encoder(x[i : i + 1]) for i in range(len(x))]`, `for s in x:
encoder(s)`) calls the module on views of one tensor along its first dim. The trial learns
that from the job before acting, and checks that it times the job's own fix:

- it acts only once one step has called the module on LEARN_CALLS or more slices of one base
  tensor covering half its rows or more (a module called on a few rows of a larger tensor, a
  dataset's, would be computed on all of it: not the job's fix); LEARN_STEPS steps with none
  and the step log says "# not applied";
- on its first CHECKS batched calls the call's own output is computed too and must equal the
  batched output's slice; a module that mixes samples (batch norm in training) or draws random
  numbers (dropout) differs, and the module runs per call again ("# not applied");
- the batched output is handed out as copies of its slices through one autograd node whose
  backward concatenates their gradients: one graph, gradients as the per-call graphs give them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

LEARN_CALLS = 4  # slices of one base in one step that are a loop over it
LEARN_COVER = 0.5  # the share of the base's rows those slices cover
LEARN_STEPS = 3  # optimizer steps with calls but none such: not applied
SEEN_MAX = 64  # bases remembered while learning
CHECKS = 3  # batched calls whose slice is checked against the call's own output


def slice_of(x: Any) -> tuple[Any, int, int, bool] | None:
    """(base, first row, rows, kept) where tensor `x` is rows of its base along dim 0 (kept:
    `x` keeps that dim, `base[a:b]`; else it is one row without it, `base[a]`), or None."""
    base = x._base
    if base is None or base.dim() == 0 or x.dtype != base.dtype:
        return None
    step = base.stride(0)
    off = x.storage_offset() - base.storage_offset()
    if step <= 0 or off < 0 or off % step:
        return None
    first, shape, strides = off // step, base.shape, base.stride()
    if x.dim() == base.dim() and x.shape[1:] == shape[1:]:
        if x.stride() != strides and not _same(x.shape, x.stride(), strides):
            return None
        rows, kept = x.shape[0], True
    elif x.dim() == base.dim() - 1 and x.shape == shape[1:]:
        if x.stride() != strides[1:] and not _same(x.shape, x.stride(), strides[1:]):
            return None
        rows, kept = 1, False
    else:
        return None
    if rows < 1 or first + rows > shape[0] or rows >= shape[0]:
        return None
    return base, first, rows, kept


def _same(shape: Any, strides: tuple, other: tuple) -> bool:
    """Whether two layouts of one shape are the same (a dim of size 1 has any stride)."""
    return all(n == 1 or s == o for n, s, o in zip(shape, strides, other, strict=True))


def pieces_fn(torch: Any) -> Any:
    """An autograd Function: a batched output's copies of its slices of `rows` along dim 0
    (squeezed: without that dim), one node whose backward concatenates their gradients."""

    class Pieces(torch.autograd.Function):
        @staticmethod
        def forward(ctx, full, rows, squeeze):
            ctx.rows, ctx.squeeze = rows, squeeze
            parts = full.split(rows)
            return tuple(p.squeeze(0).clone() if squeeze else p.clone() for p in parts)

        @staticmethod
        def backward(ctx, *grads):
            parts = [g.unsqueeze(0) if ctx.squeeze else g for g in grads]
            return torch.cat(parts), None, None

    return Pieces


class Batched:
    """The batched fix on one module: learn, then serve its calls on slices of one batch from
    one call on the whole batch, checked as it runs."""

    def __init__(self, torch: Any, target: str, log: Callable[[str], None]) -> None:
        self.torch, self.target, self.log = torch, target, log
        self.pieces = pieces_fn(torch)
        self.on = False
        self.off: str | None = None
        self.step = 0
        self.looked = 0  # steps that called it, while learning
        self.seen: dict[int, tuple[Any, set[tuple[int, int]]]] = {}  # this step's slices
        self.kept: tuple | None = None  # (key, base ref, full output, rows, kept, its pieces)
        self.checks = 0
        self.calls = self.served = self.batches = 0
        self.params: list | None = None  # the module's parameters, read once
        # the call a loop makes next, once one was served: [its base, storage offset, shape,
        # strides, piece index, the base's version, the parameters' versions, grad mode]
        self.next: list | None = None

    def stop(self, why: str) -> None:
        if self.off is None:
            self.off = why
            self.log(f"# not applied: {self.target}: {why}")

    def on_step(self) -> None:
        """An optimizer step: what the module learnt in it decides whether to act."""
        self.step += 1
        self.kept = self.next = None  # the step's graph is spent: nothing of it held
        if self.on or self.off is not None or not self.seen:
            self.seen.clear()
            return
        self.seen.clear()
        self.looked += 1
        if self.looked >= LEARN_STEPS:
            self.stop(
                f"no step called it on {LEARN_CALLS} or more slices of one batch covering half "
                "its rows or more (a loop over a batch's samples): batching its calls would not "
                "be this job's change"
            )

    def learn(self, base: Any, first: int, rows: int) -> None:
        ref, spans = self.seen.get(id(base), (None, set()))
        if len(self.seen) > SEEN_MAX:  # no optimizer step clears them (an inference loop)
            self.seen.clear()
        if ref is None or ref() is not base:
            ref, spans = weakref.ref(base), set()
            self.seen[id(base)] = (ref, spans)
        spans.add((first, rows))
        covered = sum(r for _, r in spans)
        if len(spans) >= LEARN_CALLS and covered >= LEARN_COVER * base.shape[0]:
            self.on = True
            self.log(
                f"# applied: {self.target}'s calls on slices of one batch computed once on the "
                f"batch (learnt at step {self.step + 1}: {len(spans)} calls on {covered} of "
                f"{base.shape[0]} rows)"
            )

    def key(self, base: Any, mod: Any) -> tuple:
        """What a batched output stands for: the base unchanged, the module's parameters
        unchanged, the same grad mode and optimizer step."""
        if self.params is None:
            self.params = list(mod.parameters())
        params = tuple(p._version for p in self.params)
        return (self.step, base._version, self.torch.is_grad_enabled(), params)

    def versions(self) -> int:
        """The module's parameters' versions, summed (each only grows: a write changes it)."""
        return sum(p._version for p in self.params or ())

    def expected(self, x: Any) -> Any:
        """The piece for the call the last served one announced (the loop's next slice of the
        same unchanged base, under the same parameters and grad mode), or None."""
        nxt = self.next
        if nxt is None or self.kept is None:
            return None
        base, offset, shape, strides, idx, version, params, grad = nxt
        if x._base is not base or x.storage_offset() != offset or x.shape != shape:
            return None
        if x.stride() != strides or base._version != version or self.versions() != params:
            return None
        if self.torch.is_grad_enabled() != grad:
            return None
        return self.kept[5][idx]

    def announce(self, x: Any, base: Any, first: int, rows: int, kept: bool) -> None:
        """What the loop's next call is if it takes the next slice of the same length (a
        whole piece of the kept batch); None where it cannot tell."""
        k, nxt = self.kept, first + rows
        self.next = None
        if k is None or rows != k[3] or kept != k[4] or nxt % rows or nxt + rows > base.shape[0]:
            return
        offset = x.storage_offset() + rows * base.stride(0)
        self.next = [base, offset, x.shape, x.stride(), nxt // rows, base._version,
                     self.versions(), self.torch.is_grad_enabled()]  # fmt: skip

    def forward(self, mod: Any, orig: Any, args: tuple, kwargs: dict) -> Any:
        if self.off is not None or kwargs or len(args) != 1:
            return orig(*args, **kwargs)
        x = args[0]
        if self.next is not None and self.checks >= CHECKS and isinstance(x, self.torch.Tensor):
            piece = self.expected(x)
            if piece is not None:  # the loop's next slice: served without reading its layout
                self.calls += 1
                self.served += 1
                nxt, rows = self.next, self.kept[3]  # type: ignore[index]
                nxt[1] += rows * nxt[0].stride(0)
                nxt[4] += 1
                if (nxt[4] + 1) * rows > nxt[0].shape[0]:
                    self.next = None  # the last whole piece served
                return piece
        got = slice_of(x) if isinstance(x, self.torch.Tensor) else None
        if got is None:
            return orig(x)
        base, first, rows, kept = got
        self.calls += 1
        if not self.on:
            self.learn(base, first, rows)
            return orig(x)
        batch = self.batch(mod, orig, base, rows, kept)
        if batch is None:
            return orig(x)
        _, _, full, size, was_kept, parts = batch
        if was_kept == kept and rows == size and first % size == 0:
            out = parts[first // size]
        else:  # a slice of another length: a view of the batched output
            out = full.narrow(0, first, rows) if kept else full[first]
        if self.checks < CHECKS:
            self.checks += 1
            if not self.same(orig, x, out):
                return orig(x)
        self.served += 1
        self.announce(x, base, first, rows, kept)
        return out

    def batch(self, mod: Any, orig: Any, base: Any, rows: int, kept: bool) -> tuple | None:
        """The batched output for `base` (computed now unless kept), or None (not applied)."""
        key = self.key(base, mod)
        k = self.kept
        if k is not None and k[0] == key and k[1]() is base:
            return k
        self.kept = self.next = None
        full = orig(base)
        if not isinstance(full, self.torch.Tensor) or full.dim() == 0:
            self.stop("its output is not one tensor: its slices cannot be handed out")
            return None
        if full.shape[0] != base.shape[0]:
            self.stop(
                f"its output's first dim ({full.shape[0]}) is not its input's ({base.shape[0]}):"
                " its output is not per sample"
            )
            return None
        self.batches += 1
        parts = self.pieces.apply(full, rows, not kept)
        self.kept = (key, weakref.ref(base), full, rows, kept, parts)
        return self.kept

    def same(self, orig: Any, x: Any, out: Any) -> bool:
        """Whether the call's own output equals the batched output's slice (else say why)."""
        torch = self.torch
        with torch.no_grad():
            own = orig(x)
            ok = (
                isinstance(own, torch.Tensor)
                and own.shape == out.shape
                and bool(torch.allclose(own, out, rtol=1e-4, atol=1e-5))
            )
        if not ok:
            self.kept = None
            self.stop(
                "its output for one call differs from the same rows of its output for the whole "
                "batch: it mixes samples (batch norm in training, a batch statistic) or draws "
                "random numbers (dropout)"
            )
        return ok

    def state(self) -> str:
        """The step log's line on how many calls were served batched."""
        if self.off is not None:
            return f"# not applied: {self.target}: {self.off}"
        return (
            f"# applied: {self.target}'s calls on slices of one batch computed once on the "
            f"batch: {self.served} of {self.calls} calls served from {self.batches} batched calls"
        )
