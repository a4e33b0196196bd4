"""Where a training step's compute goes: the top modules' forward and backward, the model's own
code, the optimizer step, and the rest of the step, on a few sampled steps.

Runs inside the job (loaded by gpudiag_hooks; imports nothing from gpudiag). The model is the
outermost module with parameters that forwarded before the first optimizer step (gpudiag_serve's
`Recorder.models`); its "units" are its children, a ModuleList's or ModuleDict's items in their
place, a wrapper of one child (DataParallel, an EMA holder) looked through.

At most once every SAMPLE_EVERY_S, the step after an optimizer step is armed: forward pre/post
hooks on the model and its units, a tensor hook on each unit's output (the gradient reaching it
starts the unit's backward; the backward's wall time is cut at those starts), torch.autograd's
backward timed, and a global optimizer pre-hook. Everything is taken out at the armed step's
own optimizer post-hook. The model is found on the last warm-up step, so the first armed step
is the one after WARMUP_STEPS. Some armed steps instead count the work each unit does under a
dispatch mode (its time is not used: the mode slows it): the COUNT_FIRST armed steps after a
look's first timed one (a look's first armed step is timed: the table needs a timed step, and
a look of a few slow steps, 7 steps at 7 s, ended before the timed step that came after two
counts), so a look of 10 s or more holds two counts, then one every COUNT_MIN_S or more, spaced
so that what counting adds to the job stays under COUNT_BUDGET of its time (the counted step's
extra time over the timed step's, measured in the job, over the budget). It counts the FLOPs as
torch.utils.flop_counter counts them, the bytes of each op's tensors in and out, the ops, the
FLOPs' dtypes, and the largest matrix product's shape (the agent calibrates the CPU on it).
On a GPU the times are CUDA events read once the step's work is done.

Each timed record also carries `bare`: the mean wall time of the last steps that ran with
nothing armed, so that the agent can tell what the timed step's own hooks cost (on a CPU they
run on the job's thread: their marks and readings land in the places that stay after a change).

Costs: on unsampled steps two clock reads and a comparison in the step hook; the armed step's
hooks, a few microseconds a module call. A torch.compile'd model is not armed (hooks recompile it).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from typing import Any

SAMPLE_EVERY_S = 2.0  # a timed step at most this often
COUNT_FIRST = 2  # the first armed steps of a look are counted (a short look holds counts)
COUNT_MIN_S = 4.0  # then a counted step at most this often...
COUNT_BUDGET = 0.004  # ...and at most this share of the job's time added by counting
WARMUP_STEPS = 3  # steps before the first armed one (allocator, autotuning, lazy init)
MAX_UNITS = 48  # units timed; the rest of the model counts as its own code
MAX_INNER = 512  # modules inside the units read apart (their own ops' bytes and time)
MAX_INNER_CALLS = 4096  # their calls timed in one step
MAX_INNER_ROWS = 64  # their own times sent a step (the longest)
# a part whose own ops moved this many times its io on a counted step is timed on the timed
# steps after (its calls and those it makes): half the agent's bar (COMP001's IO_AMPLIFY)
WIDE_MIN = 8.0
# ops a part's own forward runs that tell F.scaled_dot_product_attention's unfused math path
# (torch >= 2.5: `_safe_softmax` is that path's softmax) and its dropout (on a CPU no fused
# kernel takes dropout: in training a Hugging Face encoder's SDPA attention falls back to it)
SDPA_MARKS = {"_safe_softmax": "math", "bernoulli_": "dropout", "native_dropout": "dropout"}
MAX_RECORDS = 16
BARE_KEPT = 9  # bare steps' times kept (their mean is each timed record's `bare`)
DEBUG = False  # records buffered for the next flush
OWN = "(model's own code)"  # forward time in the model outside its units
OUTSIDE = "(outside the model)"  # ops of the step outside the model's forward and backward
OPT = "(optimizer)"


def find_units(root: Any) -> list[tuple[str, Any]]:
    """The model's units: (dotted name, module), a container's items in its place, a wrapper of
    one child looked through; at most MAX_UNITS."""
    from torch import nn

    prefix, top = "", root
    for _ in range(4):  # DataParallel(model), EMA(model): one child, look through it
        kids = list(top.named_children())
        if len(kids) != 1:
            break
        name, top = kids[0]
        prefix += name + "."
    out: list[tuple[str, Any]] = []
    for name, child in top.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out += [(f"{prefix}{name}.{n}", c) for n, c in child.named_children()]
        else:
            out.append((prefix + name, child))
    seen: set[int] = set()
    units = []
    for name, mod in out:
        if id(mod) not in seen:
            seen.add(id(mod))
            units.append((name, mod))
    return units[:MAX_UNITS]


def inner_modules(units: Any) -> dict[int, tuple[str, str]]:
    """id -> (unit, dotted name) of each module inside a unit that calls others (the unit
    included): a block's parts (its attention, a product written out inside it) are read
    apart, each by its own ops (those of the modules it calls left to them); at most
    MAX_INNER."""
    out: dict[int, tuple[str, str]] = {}
    for name, mod in units:
        if _leaf(mod):
            continue  # a layer: its own row holds its ops alone
        try:
            for sub, m in mod.named_modules():
                if len(out) >= MAX_INNER:
                    return out
                out.setdefault(id(m), (name, f"{name}.{sub}" if sub else name))
        except Exception:
            continue
    return out


def _leaf(mod: Any) -> bool:
    """A module that calls no other: its intermediates are its own ops' making."""
    try:
        return next(iter(mod.children()), None) is None
    except Exception:
        return False


def remove_all(handles: list) -> None:
    """Take out hooks (a handle that fails to go is left: the job runs on)."""
    for h in handles:
        try:
            h.remove()
        except Exception:
            pass


def _tensors(value: object, depth: int = 0) -> list:
    """The tensors of a module's output (a tuple's, a dict's or a ModelOutput's items)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if depth >= 2:
        return []
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict):
        items = list(value.values())
    else:
        return []
    out = []
    for v in items[:8]:
        out += _tensors(v, depth + 1)
    return out


class Clock:
    """Wall time on a CPU; CUDA events on a GPU (read once the step's work is done)."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch = torch
        self.cuda = cuda
        self.t0 = time.perf_counter()
        self.base = None
        if cuda:
            self.base = torch.cuda.Event(enable_timing=True)
            self.base.record()

    def mark(self):
        if not self.cuda:
            return time.perf_counter() - self.t0
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, mark: Any) -> float:
        if not self.cuda:
            return mark
        base: Any = self.base
        return base.elapsed_time(mark) / 1000.0


class Work:
    """Work counted per place (unit, the model's own code, outside, optimizer) in one step."""

    def __init__(self) -> None:
        self.flops: dict[tuple[str, str], float] = {}  # (place, phase) -> FLOPs
        self.bytes: dict[tuple[str, str], float] = {}
        self.ops: dict[tuple[str, str], int] = {}
        self.dtypes: dict[str, dict[str, float]] = {}  # place -> dtype -> FLOPs
        self.gemm: tuple[float, str, tuple[int, int, int]] | None = None  # largest product
        self.names: dict[str, dict[str, int]] = {}  # place -> op name -> count

    def add(self, place: str, phase: str, flops: float, nbytes: float, dtype: str, op: str) -> None:
        key = (place, phase)
        names = self.names.setdefault(place, {})
        names[op] = names.get(op, 0) + 1
        self.flops[key] = self.flops.get(key, 0.0) + flops
        self.bytes[key] = self.bytes.get(key, 0.0) + nbytes
        self.ops[key] = self.ops.get(key, 0) + 1
        if flops:
            d = self.dtypes.setdefault(place, {})
            d[dtype] = d.get(dtype, 0.0) + flops


def _nbytes(v: Any) -> float:
    try:
        return float(v.numel() * v.element_size())
    except Exception:
        return 0.0


def make_mode(torch: Any, arm: Armed) -> Any:
    """A dispatch mode counting each op's FLOPs (torch.utils.flop_counter's registry), its
    tensors' bytes and its dtype, to the place `arm` says is running."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    Tensor = torch.Tensor

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            try:
                arm.count(func, args, kwargs, out, flop_registry, Tensor)
            except Exception:
                pass
            return out

    return Counting()


class Armed:
    """One armed step: its hooks, its marks and, when counting, its work."""

    def __init__(self, sampler: Sampler, root: Any, units: Any, counting: bool) -> None:
        torch = sampler.torch
        self.sampler = sampler
        self.counting = counting
        self.clock = Clock(torch, sampler.cuda)
        self.root = root
        self.units = units
        self.names = {id(m): n for n, m in units}
        self.place = OUTSIDE  # where the ops now run (counting)
        self.stack: list[str] = []
        self.phase = "fwd"
        self.fwd: list = []  # (start, end) of the model's forwards
        self.unit_fwd: dict[str, list] = {}
        self.calls: dict[str, int] = {}
        self.inputs: dict[str, set] = {}  # unit -> its calls' input keys this step
        self.repeat: dict[str, int] = {}  # unit -> calls on an input it already had this step
        self.first_input: dict[str, tuple] = {}  # unit -> its first call's input key
        self.grad_out: dict[str, int] = {}  # unit -> calls whose output requires grad
        self.zeros: dict[str, list[float]] = {}  # unit -> its output gradients' zero shares
        self.unread: dict[str, Any] = {}  # unit -> an output gradient mostly zero (read_span)
        self.outputs: set[int] = set()  # ids of the units' outputs hooked this step
        self.io: dict[str, float] = {}  # leaf unit -> bytes of its inputs, outputs, parameters
        self.inner = inner_modules(units)  # the units' parts, read apart (see inner_modules)
        self.icalls: list[list] = []  # their forward calls: [name, start, end, parent call]
        self.istack: list[int] = []  # the calls in progress (indices of icalls)
        self.iwork: dict[str, list[float]] = {}  # part -> [own bytes, own FLOPs, io bytes]
        self.imarks: dict[str, set] = {}  # part -> the SDPA_MARKS its own ops showed
        self.bwd: list = []  # (start, end) of backward calls
        self.bwd_marks: list = []  # (mark, unit) a unit's backward begins
        self.opt_start = None
        self.handles: list = []
        self.work = Work() if counting else None
        self.mode = None
        self._orig_backward = None
        # the hooks' own time on a CPU (their bodies run on the job's thread, inside the step's
        # places): (phase, place) -> seconds, taken out of those places in `record`
        self.spent: dict[tuple[str, str], float] = {}
        self._install(torch)
        self.start = self.clock.mark()  # the step's time begins once the hooks are in

    def _install(self, torch: Any) -> None:
        """Global module hooks (none on the model itself: a deepcopy of it, an EMA's, must not
        copy them), the optimizer pre-hook, torch.autograd.backward timed, the counting mode."""
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer

        pre = {id(m): self._unit_pre(n) for n, m in self.units}
        post = {id(m): self._unit_post(n) for n, m in self.units}
        pre[id(self.root)], post[id(self.root)] = self._root_pre, self._root_post

        inner = self.inner

        def global_pre(mod, args):
            hook = pre.get(id(mod))
            res = None if hook is None else hook(mod, args)
            if id(mod) in inner:
                self._inner_pre(mod, args)
            return res

        def global_post(mod, args, out):
            if id(mod) in inner:
                self._inner_post(mod, out)
            hook = post.get(id(mod))
            return None if hook is None else hook(mod, args, out)

        self.handles.append(nn_module.register_module_forward_pre_hook(global_pre))
        self.handles.append(nn_module.register_module_forward_hook(global_post))
        self.handles.append(optimizer.register_optimizer_step_pre_hook(self._opt_pre))
        self._orig_backward = torch.autograd.backward
        torch.autograd.backward = self._timed_backward(self._orig_backward)
        if self.counting:
            mode: Any = make_mode(torch, self)
            mode.__enter__()
            self.mode = mode

    def remove(self) -> None:
        """Everything out (in the step's optimizer post-hook: no forward or backward runs)."""
        if self.mode is not None:
            try:
                self.mode.__exit__(None, None, None)
            except Exception:
                pass
            self.mode = None
        torch = self.sampler.torch
        if self._orig_backward is not None and getattr(torch.autograd.backward, "_gpudiag", 0):
            torch.autograd.backward = self._orig_backward
        remove_all(self.handles)
        self.handles = []

    # --- the hooks -------------------------------------------------------------------
    def _root_pre(self, mod, args):
        self.phase = "fwd"
        self._root_t0 = self.clock.mark()
        self.stack = [OWN]
        self.place = OWN
        return None

    def _root_post(self, mod, args, out):
        self.fwd.append((self._root_t0, self.clock.mark()))
        self.stack = []
        self.place = OUTSIDE
        return None

    def _spend(self, phase: str, place: str, since: float) -> None:
        """A hook's body from `since` on, spent inside `place`'s `phase` (on a CPU: a GPU's
        marks are the device's time, which the host's hooks do not take)."""
        if not self.clock.cuda:
            key = (phase, place)
            self.spent[key] = self.spent.get(key, 0.0) + time.perf_counter() - since

    def _unit_pre(self, name: str) -> Callable[..., None]:
        def pre(mod, args):
            if not self.stack:  # the unit called outside the model's forward
                return None
            since = time.perf_counter()
            caller = self.stack[-1]
            self.stack.append(name)
            self.place = name
            self.calls[name] = self.calls.get(name, 0) + 1
            for t in _tensors(args)[:1]:
                # its input's gradient: its backward is done (where the input is another
                # unit's output, that unit's backward begins there instead)
                if t.requires_grad and id(t) not in self.outputs:
                    t.register_hook(self._bwd_end)
            key = input_key(args)
            if key is not None:
                seen = self.inputs.setdefault(name, set())
                if key in seen:
                    self.repeat[name] = self.repeat.get(name, 0) + 1
                seen.add(key)
                self.first_input.setdefault(name, key)
            if self.counting and _leaf(mod):  # what a layer takes in: inputs, parameters
                took = sum(_nbytes(t) for t in _tensors(args)) + self._param_bytes(mod)
                self.io[name] = self.io.get(name, 0.0) + took
            self._spend("fwd", caller, since)
            self.unit_fwd.setdefault(name, []).append([self.clock.mark(), None])
            return None

        return pre

    def _param_bytes(self, mod: Any, recurse: bool = True) -> float:
        try:
            return float(sum(_nbytes(p) for p in mod.parameters(recurse=recurse)))
        except Exception:
            return 0.0

    def _inner_pre(self, mod: Any, args: Any) -> None:
        """A part of a unit begins its forward. Counting: its own ops are counted to it until a
        module it calls begins; what it takes in (its inputs, its own parameters) is its io.
        Timed: a part a counted step found wide (WIDE_MIN), and what it calls, are timed
        (nothing else: a step with none marks no time)."""
        if not self.stack or self.phase != "fwd" or len(self.icalls) >= MAX_INNER_CALLS:
            return
        name = self.inner[id(mod)][1]
        if not self.counting and not self.istack and name not in self.sampler.wide:
            return
        parent = self.istack[-1] if self.istack else -1
        self.istack.append(len(self.icalls))
        self.icalls.append([name, None if self.counting else self.clock.mark(), None, parent])
        if self.counting:
            took = sum(_nbytes(t) for t in _tensors(args)) + self._param_bytes(mod, False)
            self._iwork(name)[2] += took

    def _inner_post(self, mod: Any, out: Any) -> None:
        name = self.inner[id(mod)][1]
        if not any(self.icalls[i][0] == name for i in self.istack):
            return  # a call not taken (not timed, or past MAX_INNER_CALLS)
        while self.icalls[self.istack[-1]][0] != name:
            self.istack.pop()  # a forward that raised left its call open
        call = self.icalls[self.istack.pop()]
        if not self.counting:
            call[2] = self.clock.mark()
        if self.counting:
            self._iwork(name)[2] += sum(_nbytes(t) for t in _tensors(out))

    def _inner_count(self, nbytes: float, flops: float, op: str = "") -> None:
        """An op of the forward, counted to the innermost part running (its own op); the ops
        that tell scaled_dot_product_attention's unfused math path (SDPA_MARKS) noted."""
        if self.istack and self.phase == "fwd":
            name = self.icalls[self.istack[-1]][0]
            w = self._iwork(name)
            w[0] += nbytes
            w[1] += flops
            if op in SDPA_MARKS:
                self.imarks.setdefault(name, set()).add(SDPA_MARKS[op])

    def _iwork(self, name: str) -> list[float]:
        return self.iwork.setdefault(name, [0.0, 0.0, 0.0])

    def _unit_post(self, name: str) -> Callable[..., None]:
        def post(mod, args, out):
            if not self.stack or self.stack[-1] != name:
                return None
            self.stack.pop()
            self.place = self.stack[-1] if self.stack else OUTSIDE
            self.unit_fwd[name][-1][1] = self.clock.mark()
            since = time.perf_counter()
            if self.counting and name in self.io:
                self.io[name] += sum(_nbytes(t) for t in _tensors(out))
            for t in _tensors(out):
                if t.requires_grad:
                    self.grad_out[name] = self.grad_out.get(name, 0) + 1
                    self.outputs.add(id(t))
                    t.register_hook(self._bwd_start(name))
                    break
            self._spend("fwd", self.stack[-1] if self.stack else OUTSIDE, since)
            return None

        return post

    def _bwd_start(self, name: str) -> Callable[..., None]:
        def hook(grad):
            self.bwd_marks.append((self.clock.mark(), name))
            self.place = name
            if not self.counting:  # (the counting mode would count the look as its work)
                since = time.perf_counter()
                share = zero_share(grad)
                if share is not None:
                    self.zeros.setdefault(name, []).append(share)
                if share is not None and share >= READ_SPAN_ZEROS:
                    self.unread.setdefault(name, grad)  # read after the step (untimed)
                self._spend("bwd", name, since)
            return None

        return hook

    def _bwd_end(self, grad: Any) -> None:
        """A unit's backward reached its input: the model's own code's backward (the ops
        between units: a loop over positions, a pooling) runs until the next unit's begins."""
        if self.phase == "bwd":
            self.bwd_marks.append((self.clock.mark(), OWN))
            self.place = OWN
        return None

    def _timed_backward(self, orig):
        def backward(*args, **kwargs):
            self.phase = "bwd"
            self.place = OUTSIDE  # the loss's own backward until a unit's begins
            t0 = self.clock.mark()
            try:
                return orig(*args, **kwargs)
            finally:
                self.bwd.append((t0, self.clock.mark()))
                self.phase = "fwd"
                self.place = OUTSIDE

        backward._gpudiag = 1  # type: ignore[attr-defined]  # our mark on the wrapper
        return backward

    def _opt_pre(self, opt, args, kwargs):
        if self.opt_start is None:
            self.opt_start = self.clock.mark()
        self.phase = "opt"
        self.place = OPT
        return None

    # --- counting --------------------------------------------------------------------
    def count(
        self, func: Any, args: tuple, kwargs: dict, out: Any, registry: dict, Tensor: Any
    ) -> None:
        work = self.work
        if work is None:
            return
        if getattr(func, "is_view", False) or func in self.sampler.skipped:
            return  # a view does no work; a profiler mark is not the job's
        packet = func._overloadpacket
        flops = 0.0
        counter = registry.get(packet)
        if counter is not None:
            flops = float(counter(*args, **kwargs, out_val=out))
        nbytes = 0.0
        dtype = ""
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, Tensor):
                nbytes += _nbytes(a)
                dtype = dtype or str(a.dtype).replace("torch.", "")
            elif isinstance(a, (list, tuple)):
                for b in a[:64]:
                    if isinstance(b, Tensor):
                        nbytes += _nbytes(b)
        for o in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(o, Tensor):
                nbytes += _nbytes(o)
        work.add(self.place, self.phase, flops, nbytes, dtype, packet.__name__)
        self._inner_count(nbytes, flops, packet.__name__)
        if flops and packet in self.sampler.gemm_ops:
            self._note_gemm(flops, dtype, args, out, packet is self.sampler.conv)

    def _note_gemm(self, flops: float, dtype: str, args: tuple, out: Any, conv: bool) -> None:
        """The largest matrix product's (m, k, n); a convolution's as the GEMM it lowers to
        (m: batch x output positions, k: input channels x kernel, n: output channels)."""
        work = self.work
        if work is None or (work.gemm is not None and work.gemm[0] >= flops):
            return
        shapes = [tuple(a.shape) for a in args[:3] if hasattr(a, "shape") and len(a.shape) >= 2]
        if len(shapes) < 2:
            return
        if conv:
            w, o = shapes[1], tuple(out.shape)
            mnk = (int(o[0] * math.prod(o[2:])), int(math.prod(w[1:])), int(w[0]))
        else:
            a, b = shapes[-2], shapes[-1]
            mnk = (int(math.prod(a[:-1])), int(a[-1]), int(b[-1]))
        work.gemm = (flops, dtype, mnk)

    # --- the record ------------------------------------------------------------------
    def record(self, end: Any, optimizer: Any) -> dict:
        """What the step measured, as the datagram carries it."""
        sec = self.clock.seconds
        t0 = sec(self.start)
        step = sec(end) - t0
        fwd = sum(sec(b) - sec(a) for a, b in self.fwd)
        bwd = sum(sec(b) - sec(a) for a, b in self.bwd)
        opt = sec(end) - sec(self.opt_start) if self.opt_start is not None else math.nan
        units, own_bwd = self._unit_times()
        spent = sum(self.spent.values())
        fwd -= sum(v for (ph, _), v in self.spent.items() if ph == "fwd")
        bwd -= sum(v for (ph, _), v in self.spent.items() if ph == "bwd")
        own = fwd - sum(v[0] for v in units.values())
        step -= spent
        rec: dict = {
            "t": time.time(),
            "count": int(self.counting),
            "step": step,
            "fwd": fwd,
            "bwd": bwd,
            "opt": opt,
            "own": max(0.0, own),
            "own_bwd": own_bwd,
            "units": [[n, v[0], v[1], self.calls.get(n, 0)] for n, v in units.items()],
            "model": type(self.root).__name__,
            "device": self._device(),
            "hooks": spent,  # the hooks' own time, taken out of the places above
        }
        if self.counting and self.work is not None:
            rec["work"] = self._work_rows()
            rec["inner"] = self._inner_work()
            self.sampler.wide = {r[1] for r in rec["inner"] if r[2] >= WIDE_MIN * r[3]}
            if self.work.gemm is not None:
                rec["gemm"] = [self.work.gemm[1], *self.work.gemm[2]]
        elif self.icalls:
            rec["inner_s"] = self._inner_times()
        if optimizer is not None:
            rec["groups"] = optimizer_groups(self.sampler.torch, optimizer)
        if not self.counting:
            rec["why"] = self._why(optimizer)
            bare = self.sampler.bare_s()
            if bare is not None:
                rec["bare"] = bare
            if optimizer is not None:
                rec["gzero"] = group_zeros(self.sampler.torch, optimizer, self.root)
        return rec

    def _unit_times(self) -> tuple[dict[str, list[float]], float]:
        """Each unit's [forward, backward] seconds and the model's own code's backward, the
        hooks' own time in a unit taken out (`spent`)."""
        sec = self.clock.seconds
        units: dict[str, list[float]] = {}
        for name, spans in self.unit_fwd.items():
            units[name] = [sum(sec(b) - sec(a) for a, b in spans if b is not None), 0.0]
        own_bwd = 0.0
        for (a, b), name in self._bwd_spans():
            if name == OWN:
                own_bwd += b - a
            else:
                units.setdefault(name, [0.0, 0.0])[1] += b - a
        for (ph, place), v in self.spent.items():
            if place in units:
                i = 0 if ph == "fwd" else 1
                units[place][i] = max(0.0, units[place][i] - v)
        return units, own_bwd

    def _why(self, optimizer: Any) -> list:
        """Per unit, what its tensors show of work nobody needs or work repeated: the share of
        its outputs whose gradient is zero (or that reach no loss), the elements of its
        parameters given a gradient that no optimizer updates, its calls on an input it already
        had this step, and whether it ran on the same unchanged input as on the last sampled
        step with no output requiring grad (the same result again)."""
        held = optimizer_params([*list(self.sampler.optimizers), optimizer])
        last = self.sampler.last_inputs
        rows = []
        for name, mod in self.units:
            calls = self.calls.get(name, 0)
            if not calls:
                continue
            hooked = self.grad_out.get(name, 0)
            zeros = self.zeros.get(name, [])
            unused = None
            if hooked:  # an output no gradient reached counts as all unused
                unused = (sum(zeros[:hooked]) + max(0, hooked - len(zeros))) / hooked
            orphan = 0.0
            if held is not None:
                try:
                    orphan = float(
                        sum(
                            p.numel()
                            for p in mod.parameters()
                            if p.grad is not None and id(p) not in held
                        )
                    )
                except Exception:
                    orphan = 0.0
            key = self.first_input.get(name)
            constant = float(key is not None and not hooked and last.get(name) == key)
            if key is not None:
                last[name] = key
            row = [name, unused, orphan, float(self.repeat.get(name, 0)), constant]
            span = read_span(self.unread[name]) if name in self.unread else None
            rows.append(row + list(span) if span is not None else row)
        self.unread.clear()
        return rows

    def _inner_work(self) -> list:
        """Per unit, its part whose own forward ops move the most bytes over what it takes
        in and gives out: [unit, part, own bytes, io bytes, own FLOPs]."""
        unit_of = {name: unit for unit, name in self.inner.values()}
        best: dict[str, list] = {}
        for name, (nbytes, flops, io) in self.iwork.items():
            unit = unit_of.get(name)
            if unit is None or io <= 0 or nbytes <= 0:
                continue
            old = best.get(unit)
            if old is None or nbytes / io > old[2] / old[3]:
                best[unit] = [unit, name, nbytes, io, flops]
        for row in best.values():
            marks = self.imarks.get(row[1], set())
            if "math" in marks:  # its dropout matters only where SDPA fell back
                row.append("sdpa_math" + ("_dropout" if "dropout" in marks else ""))
        return list(best.values())[:MAX_UNITS]

    def _inner_times(self) -> list:
        """The units' parts' own forward time (their calls' time less the calls they made):
        [unit, part, seconds], the longest MAX_INNER_ROWS."""
        sec = self.clock.seconds
        dur = [
            (sec(c[2]) - sec(c[1])) if c[1] is not None and c[2] is not None else 0.0
            for c in self.icalls
        ]
        own = list(dur)
        for i, c in enumerate(self.icalls):
            if c[3] >= 0:
                own[c[3]] -= dur[i]
        unit_of = {name: unit for unit, name in self.inner.values()}
        total: dict[str, float] = {}
        for c, s in zip(self.icalls, own, strict=True):
            total[c[0]] = total.get(c[0], 0.0) + max(0.0, s)
        rows = sorted(total.items(), key=lambda kv: -kv[1])[:MAX_INNER_ROWS]
        return [[unit_of.get(n, ""), n, s] for n, s in rows if unit_of.get(n)]

    def _device(self) -> str:
        try:
            return next(self.root.parameters()).device.type
        except Exception:
            return "cpu"

    def _bwd_spans(self) -> list:
        """The backward's wall time cut at the units' starts: each span to the unit that began
        last (the loss's own backward before the first start is outside the model)."""
        sec = self.clock.seconds
        starts = sorted((sec(m), n) for m, n in self.bwd_marks)
        out = []
        for b0, b1 in self.bwd:
            lo, hi = sec(b0), sec(b1)
            marks = [(t, n) for t, n in starts if lo <= t <= hi]
            for i, (t, name) in enumerate(marks):
                nxt = marks[i + 1][0] if i + 1 < len(marks) else hi
                out.append(((t, nxt), name))
        return out

    def _work_rows(self) -> list:
        work = self.work
        assert work is not None
        places = {p for p, _ in work.flops}
        rows = []
        for place in sorted(places):
            f = [work.flops.get((place, ph), 0.0) for ph in ("fwd", "bwd", "opt")]
            b = [work.bytes.get((place, ph), 0.0) for ph in ("fwd", "bwd", "opt")]
            ops = sum(work.ops.get((place, ph), 0) for ph in ("fwd", "bwd", "opt"))
            dts = work.dtypes.get(place, {})
            dtype = max(dts, key=lambda k: dts[k]) if dts else ""
            names = work.names.get(place, {})
            top = sorted(names, key=lambda k: -names[k])[:3]
            ops_text = ",".join(f"{k}:{names[k]}" for k in top)
            io = self.io.get(place, 0.0)
            rows.append([place, *f, *b, ops, dtype, self._params(place), ops_text, io])
        return rows

    def _params(self, place: str) -> float:
        mod = dict(self.units).get(place)
        if mod is None:
            return 0.0
        try:
            return float(sum(p.numel() for p in mod.parameters()))
        except Exception:
            return 0.0


ZERO_SAMPLE = 65536  # gradient elements looked at per tensor (strided) for their zero share
# ...and per optimizer group, over all its tensors (one stride for the group: each tensor's
# share of the sample is its share of the elements): the group's zero share read from every
# element of every gradient was most of a timed step's extra
GROUP_ZERO_SAMPLE = 65536


def input_key(args: Any) -> tuple | None:
    """What identifies a call's first tensor input as unchanged: its storage, offset, shape,
    strides and in-place version (a new batch, or the same buffer written again, differs)."""
    import torch

    for a in args[:4]:
        if isinstance(a, torch.Tensor):
            try:
                return (a.data_ptr(), tuple(a.shape), a.stride(), a._version)
            except Exception:
                return None
    return None


def zero_share(grad: Any, stride: int = 1) -> float | None:
    """The share of a gradient's elements that are exactly zero (a strided sample of at most
    ZERO_SAMPLE elements, every `stride`-th or sparser: a few microseconds). An odd step: an
    even one samples the same few columns of a power-of-two row (20 on rows of 64, one row in
    10 read, gave 87.5% zero for 90%)."""
    try:
        flat = grad.detach().reshape(-1)
        n = flat.numel()
        if n == 0:
            return None
        step = max(1, stride, n // ZERO_SAMPLE)
        part = flat[:: step | 1]
        return float((part == 0).sum()) / part.numel()
    except Exception:
        return None


READ_SPAN_ZEROS = 0.75  # a unit output gradient's zero share from which its read span is read


def read_span(grad: Any) -> tuple[int, int, int] | None:
    """(dim, start, length) of the span of positions along one dim of a unit's output that its
    gradient reaches, first to last (outside it zero: nobody reads them), the dim where it is
    the smallest share of the dim; the last dim as -1, a span that ends at the dim's end with a
    start counted from the end (the last position: -1). None: no such span. One pass over the
    gradient and one over its nonzero mask per dim, on a sampled step after it is timed."""
    try:
        nz = grad.detach() != 0
        shape = tuple(nz.shape)
        best = None
        for d, size in enumerate(shape):
            if size <= 1:
                continue
            pre = 1
            for n in shape[:d]:
                pre *= n
            along = nz.reshape(pre, size, -1).any(2).any(0)
            idx = along.nonzero().flatten()
            if idx.numel() == 0:
                return None
            first, last = int(idx[0]), int(idx[-1])
            length = last - first + 1  # the hull: a position inside it may read zero this step
            if length >= size:
                continue
            if best is None or length / size < best[0]:
                start = first - size if last == size - 1 and first > 0 else first
                best = (length / size, -1 if d == len(shape) - 1 else d, start, length)
        return None if best is None else best[1:]
    except Exception:
        return None


def optimizer_params(opts: list) -> set[int] | None:
    """The ids of the tensors the job's optimizers update (None: no optimizer seen)."""
    held: set[int] = set()
    seen = False
    for opt in opts:
        if opt is None:
            continue
        try:
            held |= {id(p) for g in opt.param_groups for p in g.get("params", ())}
            seen = True
        except Exception:
            continue
    return held if seen else None


def group_zeros(torch: Any, opt: Any, root: Any) -> list:
    """Per parameter group: the share of its gradients' elements that are zero (a strided
    sample of each tensor, GROUP_ZERO_SAMPLE elements over the group, weighted by its
    elements), and the name of the parameter with the most zero elements (rows of an embedding
    nobody looked up: an update over nothing)."""
    names = {}
    try:
        names = {id(p): n for n, p in root.named_parameters()}
    except Exception:
        pass
    rows: list[list] = []
    try:
        groups = opt.param_groups
    except Exception:
        return rows
    for i, g in enumerate(groups[:16]):
        zero, total, worst, worst_zero = 0.0, 0.0, "", 0.0
        params = [p for p in g.get("params", ()) if getattr(p, "grad", None) is not None][:4096]
        stride = max(1, -(-sum(p.numel() for p in params) // GROUP_ZERO_SAMPLE))
        for p in params:
            share = zero_share(p.grad, stride)
            if share is None:
                continue
            n = float(p.numel())
            zero += share * n
            total += n
            if share * n > worst_zero:
                worst, worst_zero = names.get(id(p), ""), share * n
        if total:
            rows.append([str(i), zero / total, worst[:120]])
    return rows


def optimizer_groups(torch: Any, opt: Any) -> list:
    """Per parameter group: tensors, elements, bytes of the params and of their optimizer state,
    whether the update runs foreach or fused, and the params' dtype."""
    rows: list[list] = []
    try:
        groups = opt.param_groups
        state = opt.state
    except Exception:
        return rows
    for i, g in enumerate(groups[:16]):
        params = [p for p in g.get("params", ()) if isinstance(p, torch.Tensor)]
        with_grad = [p for p in params if p.grad is not None]
        elems = float(sum(p.numel() for p in with_grad))
        pbytes = float(sum(_nbytes(p) for p in with_grad))
        sbytes = 0.0
        for p in with_grad[:4096]:
            for v in (state.get(p) or {}).values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    sbytes += _nbytes(v)
        dtypes = {str(p.dtype).replace("torch.", "") for p in with_grad}
        rows.append(
            [
                str(i),
                float(len(with_grad)),
                elems,
                pbytes,
                sbytes,
                float(bool(g.get("foreach"))),
                float(bool(g.get("fused"))),
                ",".join(sorted(dtypes))[:40],
                type(opt).__name__,
            ]
        )
    return rows


def _overloads(packet: Any) -> list:
    """Every overload of an op packet (aten.detach: aten.detach.default...)."""
    try:
        return [getattr(packet, o) for o in packet.overloads()]
    except Exception:
        return []


class Discovery:
    """One step's global forward hooks that find the model: the outermost module with
    parameters, in training mode, that forwards in the step (the largest when several do).
    Under `attach --hooks` the hooks load mid-step, so the first forwards they see can be a
    model's inner modules; a whole step seen from its start shows the model itself."""

    def __init__(self) -> None:
        from torch.nn.modules import module as nn_module

        self.depth = 0
        self.best: Any = None
        self.best_n = -1
        self.handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post),
        ]

    def _pre(self, mod, args):
        try:
            if self.depth == 0 and mod.training:
                n = sum(p.numel() for p in mod.parameters())
                if n > self.best_n and n > 0:
                    self.best, self.best_n = mod, n
        except Exception:
            pass
        self.depth += 1
        return None

    def _post(self, mod, args, out):
        self.depth = max(0, self.depth - 1)
        return None

    def finish(self) -> Any:
        """The hooks out; the model found (None: no module forwarded in the step)."""
        remove_all(self.handles)
        self.handles = []
        try:
            return None if self.best is None else weakref.ref(self.best)
        except TypeError:
            return None


class Sampler:
    """Arms a step now and then (see the module's docstring) and keeps its records."""

    def __init__(self, torch: Any, models: Any, cuda: bool = False) -> None:
        self.torch = torch
        self.models = models  # weak set of the top modules seen forwarding
        self.cuda = cuda
        self.steps = 0
        self.next_at = 0.0
        self.count_at = 0.0
        self.counts_left = COUNT_FIRST  # counted steps owed to the look's start
        self.plain_s: float | None = None  # the last timed (uncounted) step's wall time
        self.counted = 0  # counted steps armed
        self.timed = 0  # timed steps armed in this look (its first armed step is timed)
        self.paused: Any = lambda: False  # a profiler capture at work: arm no step
        self.armed: Armed | None = None
        self.records: list[dict] = []
        self.disabled: str | None = None
        self.last_opt: Any = None
        self.optimizers: weakref.WeakSet = weakref.WeakSet()
        self.last_inputs: dict[str, tuple] = {}  # unit -> its input key on the last timed step
        self.wide: set[str] = set()  # units' parts the last counted step found wide (timed)
        self.root_ref: Any = None  # the model, as a step's outermost forward showed it
        self.finding: Discovery | None = None
        self.discovered = False
        self.plain_from: float | None = None  # when the step now running bare began
        self.bare: list[float] = []  # the last BARE_KEPT bare steps' wall times
        aten = torch.ops.aten
        self.gemm_ops = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution}
        self.conv = aten.convolution
        self.skipped = set(_overloads(aten.detach))  # not work: views, profiler marks
        for name in ("_record_function_enter_new", "_record_function_exit"):
            try:
                self.skipped.update(_overloads(getattr(torch.ops.profiler, name)))
            except Exception:
                pass

    def note_optimizer(self, opt: Any) -> None:
        try:
            self.last_opt = weakref.ref(opt)
            if len(self.optimizers) < 16:
                self.optimizers.add(opt)  # (a GAN's two: a parameter either one updates is held)
        except TypeError:
            self.last_opt = None

    def on_step(self) -> None:
        """The optimizer post-hook: finish an armed step, maybe arm the next; a step that ran
        with nothing armed is kept as a bare step's time (see `bare_s`)."""
        now = time.perf_counter()
        if self.plain_from is not None:
            self.bare = [*self.bare[1 - BARE_KEPT :], now - self.plain_from]
        try:
            self._on_step()
        finally:
            # the next step runs bare when nothing is armed for it (no step hooks, no discovery)
            bare = self.armed is None and self.finding is None and self.steps >= WARMUP_STEPS
            self.plain_from = time.perf_counter() if bare else None

    def bare_s(self) -> float | None:
        """The mean wall time of the last BARE_KEPT steps that ran with nothing armed (from
        one optimizer post-hook to the next, as an armed step's time is taken; a mean, as the
        timed steps' time is): what a step costs without the hooks' marks and readings, which a
        timed step pays. None before 3."""
        if len(self.bare) < 3:
            return None
        return sum(self.bare) / len(self.bare)

    def _on_step(self) -> None:
        self.steps += 1
        if self.armed is not None:
            self._finish()
        if self.finding is not None:
            found, self.finding = self.finding, None
            self.root_ref = found.finish()
        if self.disabled or self.steps < WARMUP_STEPS - 1 or self.paused():
            return
        if self.root_ref is not None and self.root_ref() is None:
            self.discovered = False  # the model found is gone: look again
        if not self.discovered:
            self.discovered = True
            try:  # the next step shows the model (see Discovery); armed on the one after
                self.finding = Discovery()
                return
            except Exception:
                self.finding = None
        now = time.monotonic()
        if self.steps < WARMUP_STEPS or now < self.next_at:
            return
        self.next_at = now + SAMPLE_EVERY_S
        # a look's first armed step is timed (the table's step); then the owed counts
        counting = self.timed > 0 and (self.counts_left > 0 or now >= self.count_at)
        if counting:  # owed counts and spacing taken now: a step that fails is not retried
            self.counts_left = max(0, self.counts_left - 1)
            self.count_at = now + COUNT_MIN_S
            self.counted += 1
        else:
            self.timed += 1
        self._arm(counting)

    def restart(self) -> None:
        """A new look (a new agent woke the hooks): its first armed step is timed, the next
        ones counted."""
        self.counts_left = COUNT_FIRST
        self.next_at = 0.0
        self.timed = 0

    def _spaced(self, rec: dict) -> None:
        """After a counted step, the next count no sooner than COUNT_MIN_S and than its extra
        time (over the last timed step's; the whole step before one is timed) over
        COUNT_BUDGET; after a timed one, its wall time kept for that."""
        step = rec.get("step")
        if not isinstance(step, float) or not step >= 0:
            return
        if not rec.get("count"):
            self.plain_s = step
            return
        extra = step - self.plain_s if self.plain_s is not None else step
        self.count_at = time.monotonic() + max(COUNT_MIN_S, max(0.0, extra) / COUNT_BUDGET)

    def _root(self):
        found = self.root_ref() if self.root_ref is not None else None
        if found is not None and getattr(found, "training", False):
            return found
        try:
            roots = [m for m in list(self.models) if m.training]
        except Exception:
            return None
        if not roots:
            return None
        return max(roots, key=lambda m: sum(p.numel() for p in m.parameters()))

    def _arm(self, counting: bool) -> None:
        root = self._root()
        if root is None:
            return
        if type(root).__name__ == "OptimizedModule" or hasattr(root, "_orig_mod"):
            self.disabled = "compiled"
            return
        try:
            self.armed = Armed(self, root, find_units(root), counting)
        except Exception:
            self.armed = None

    def _finish(self) -> None:
        arm, self.armed = self.armed, None
        assert arm is not None
        try:
            end = arm.clock.mark()
            arm.remove()
            if self.cuda:
                end.synchronize()
            opt = self.last_opt() if self.last_opt is not None else None
            rec = arm.record(end, opt)
            self._spaced(rec)
            if len(self.records) < MAX_RECORDS:
                self.records.append(rec)
        except Exception:
            if DEBUG:
                raise
            arm.remove()

    def take(self) -> list[dict]:
        recs, self.records = self.records, []
        return recs

    def put_back(self, recs: list[dict]) -> None:
        """Records a full queue refused, sent with the next flush (at most MAX_RECORDS)."""
        self.records = (recs + self.records)[:MAX_RECORDS]

    def cancel(self) -> None:
        """Quiet (the agent gone): an armed step's hooks out, nothing kept."""
        arm, self.armed = self.armed, None
        if arm is not None:
            arm.remove()
        found, self.finding = self.finding, None
        if found is not None:
            found.finish()
        self.records = []
