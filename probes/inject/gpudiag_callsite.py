"""`gpudiag try --fix thin:MODULE.FUNCTION:every=N` and `skip:MODULE.FUNCTION`, inside the job.

Runs inside the job under `try` only and imports nothing from gpudiag. The named function runs
on its 1st, (N+1)th, (2N+1)th... call (thin; the calls between return the last result it gave)
or never (skip; its calls return None). MODULE is a module's dotted name, the end of one (the
`utils` of `mypkg.utils`) or the stem of the job's script (`train` for `python train.py`, whose
module is `__main__`); FUNCTION is an attribute path in it (`Trainer.log_metrics`) or, failing
that, a function of that file by its name or qualified name (`main.<locals>.push`).

A Python function is patched in place (its `__code__` swapped for a shim that calls a copy of
the original), so that every reference to it, a callback handed to a loop before the trial
patched it included, takes the trial's path. A built-in (gc.collect, time.sleep, print) is
replaced on its module, so only the calls that look it up there take it. The job's script
defines its functions after it imports torch (when the hooks load), so a name not found yet is
looked for again as the job runs (at most every RETRY_S, on a model forward or optimizer step),
and the step log says "# not applied" while it is missing or has not been called.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import time
import types
from collections.abc import Callable
from typing import Any

RETRY_S = 0.25  # between attribute look-ups while the target is missing
SCAN_S = 2.0  # between scans of the heap's functions (a nested function, a method)
SCANS = 5  # heap scans at most
NOTE_AFTER_S = 2.0  # from the first look: a missing or uncalled target is said in the log
GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coro, async gen


def _stem(path: str | None) -> str:
    return os.path.splitext(os.path.basename(path or ""))[0]


def _modules(name: str) -> list[types.ModuleType]:
    """The modules a dotted name can mean: itself, one whose name ends with it, the job's
    script when its file's stem is the name."""
    out = []
    for mname, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType):
            continue
        if mname == name or mname.endswith("." + name):
            out.append(mod)
        elif (
            mname == "__main__" and "." not in name and _stem(getattr(mod, "__file__", "")) == name
        ):
            out.append(mod)
    return out


def _attr(owner: object, name: str) -> object:
    """owner's attribute `name` as stored (a class's staticmethod or classmethod itself)."""
    if isinstance(owner, type) and name in owner.__dict__:
        return owner.__dict__[name]
    return getattr(owner, name)


def by_attribute(target: str) -> list[tuple[object, str, object]]:
    """(owner, name, object) of each distinct object `target` names by attribute path."""
    parts = target.split(".")
    found: dict[int, tuple[object, str, object]] = {}
    for i in range(len(parts) - 1, 0, -1):
        for mod in _modules(".".join(parts[:i])):
            owner: object = mod
            try:
                for name in parts[i:-1]:
                    owner = _attr(owner, name)
                obj = _attr(owner, parts[-1])
            except Exception:
                continue
            found.setdefault(id(_function(obj) or obj), (owner, parts[-1], obj))
        if found:
            break
    return list(found.values())


def by_scan(target: str) -> list[types.FunctionType]:
    """The functions on the heap whose file's stem and (qualified) name `target` names: a
    function nested in another one, a method reached by no attribute path."""
    parts = target.split(".")
    wanted = []
    for i in range(len(parts) - 1, 0, -1):
        rest = ".".join(parts[i:])
        wanted.append((parts[i - 1], rest))
    main = _stem(getattr(sys.modules.get("__main__"), "__file__", ""))
    out = []
    for obj in gc.get_objects():
        if type(obj) is not types.FunctionType:  # noqa: E721 (no __class__ property read)
            continue
        stem = _stem(obj.__code__.co_filename)
        for mod, rest in wanted:
            if mod not in (stem, "__main__" if stem == main else stem):
                continue
            qual = obj.__qualname__
            if qual == rest or qual.endswith("." + rest) or obj.__name__ == rest:
                out.append(obj)
                break
    return out


def _function(obj: object) -> types.FunctionType | None:
    """The plain function behind obj (a staticmethod's or classmethod's too), or None."""
    obj = getattr(obj, "__func__", obj) if isinstance(obj, (staticmethod, classmethod)) else obj
    return obj if isinstance(obj, types.FunctionType) else None


# A function's new __code__ must keep the count of its closure's cells: one shim per count,
# written out (no source is ever compiled here), each calling its keyword-only default
# `_gpudiag_site`; the free variables are only named in a lambda that never runs.
def _shim0():

    def shim(*args, _gpudiag_site, **kwargs):
        return _gpudiag_site(args, kwargs)

    return shim.__code__


def _shim1():
    v0 = None

    def shim(*args, _gpudiag_site, **kwargs):
        if _gpudiag_site is None:
            return lambda: (v0,)
        return _gpudiag_site(args, kwargs)

    return shim.__code__


def _shim2():
    v0 = v1 = None

    def shim(*args, _gpudiag_site, **kwargs):
        if _gpudiag_site is None:
            return lambda: (v0, v1)
        return _gpudiag_site(args, kwargs)

    return shim.__code__


def _shim3():
    v0 = v1 = v2 = None

    def shim(*args, _gpudiag_site, **kwargs):
        if _gpudiag_site is None:
            return lambda: (v0, v1, v2)
        return _gpudiag_site(args, kwargs)

    return shim.__code__


def _shim4():
    v0 = v1 = v2 = v3 = None

    def shim(*args, _gpudiag_site, **kwargs):
        if _gpudiag_site is None:
            return lambda: (v0, v1, v2, v3)
        return _gpudiag_site(args, kwargs)

    return shim.__code__


def _shim5():
    v0 = v1 = v2 = v3 = v4 = None

    def shim(*args, _gpudiag_site, **kwargs):
        if _gpudiag_site is None:
            return lambda: (v0, v1, v2, v3, v4)
        return _gpudiag_site(args, kwargs)

    return shim.__code__


def _shim6():
    v0 = v1 = v2 = v3 = v4 = v5 = None

    def shim(*args, _gpudiag_site, **kwargs):
        if _gpudiag_site is None:
            return lambda: (v0, v1, v2, v3, v4, v5)
        return _gpudiag_site(args, kwargs)

    return shim.__code__


SHIMS = tuple(f() for f in (_shim0, _shim1, _shim2, _shim3, _shim4, _shim5, _shim6))


class CallSite:
    """The thin/skip fix of one named function: its calls counted, every `every`-th run
    (0: none run)."""

    def __init__(self, target: str, every: int, note: Callable[[str], None]) -> None:
        self.target, self.every, self.note = target, every, note
        self.calls = self.ran = 0
        self.last: object = None
        self.patched: list[str] = []
        self.first_look: float | None = None
        self.next_look = self.next_scan = 0.0
        self.scans = 0
        self.said: str | None = None  # the last "# ..." state written to the step log
        self.patched_at: float | None = None

    def call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """One call of the target: run it, or return what the skipped call stands for."""
        self.calls += 1
        if self.every and (self.calls - 1) % self.every == 0:
            self.ran += 1
            self.last = fn(*args, **kwargs)
            return self.last
        return self.last if self.every else None

    def patch_function(self, fn: types.FunctionType) -> str | None:
        """Swap fn's code for the shim's, calling a copy of fn; why not (None: done)."""
        if fn.__code__.co_flags & GENERATOR_FLAGS:
            return f"{fn.__qualname__} is a generator or coroutine function"
        if fn.__code__ in SHIMS or fn.__dict__.get("_gpudiag_original"):
            return None  # patched already, or the original a patch calls
        nfree = len(fn.__closure__ or ())
        if nfree >= len(SHIMS):
            return f"{fn.__qualname__} closes over {nfree} variables (at most {len(SHIMS) - 1})"
        copy = types.FunctionType(
            fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
        )
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__ = fn.__qualname__
        copy.__dict__.update(fn.__dict__)
        copy.__dict__["_gpudiag_original"] = True
        fn.__code__ = SHIMS[nfree]
        fn.__defaults__ = None
        fn.__kwdefaults__ = {"_gpudiag_site": functools.partial(self.call, copy)}
        self.patched.append(f"{fn.__module__}.{fn.__qualname__}")
        return None

    def patch_builtin(self, owner: object, name: str, obj: object) -> str | None:
        """Replace a callable with no Python code on its module or class."""
        if not callable(obj):
            return f"{self.target} is not callable"
        site = self

        def wrapper(*args, **kwargs):
            return site.call(obj, args, kwargs)

        try:
            setattr(owner, name, wrapper)
        except (AttributeError, TypeError) as exc:
            return f"{self.target} cannot be replaced ({exc})"
        self.patched.append(f"{getattr(owner, '__name__', owner)}.{name}")
        return None

    def look(self) -> bool:
        """Find and patch the target (rate-limited); whether it is patched."""
        if self.patched:
            return True
        now = time.monotonic()
        if self.first_look is None:
            self.first_look = now
        if now < self.next_look:
            return False
        self.next_look = now + RETRY_S
        why = None
        for owner, name, obj in by_attribute(self.target):
            fn = _function(obj)
            why = (
                self.patch_function(fn) if fn is not None else self.patch_builtin(owner, name, obj)
            )
        if not self.patched and self.scans < SCANS and now >= self.next_scan:
            self.scans += 1
            self.next_scan = now + SCAN_S
            for fn in by_scan(self.target):
                why = self.patch_function(fn) or why
        if self.patched:
            self.patched_at = now
        elif why:
            self._say(f"# not applied: {why}")
        return bool(self.patched)

    def tick(self) -> None:
        """On a forward or a step: look for the target; say in the log whether it acts."""
        if not self.look():
            if self.first_look is not None and time.monotonic() - self.first_look >= NOTE_AFTER_S:
                self._say(
                    f"# not applied: no function {self.target} found in the job (MODULE is a "
                    "module, the end of its name or the script's stem; FUNCTION a name in it)"
                )
            return
        if self.calls:
            self._say(self.state())
        elif self.patched_at is not None and time.monotonic() - self.patched_at >= NOTE_AFTER_S:
            self._say(
                f"# not applied: {', '.join(self.patched)} was never called since it was "
                "patched (a built-in held under another name is not reached)"
            )

    def describe(self) -> str:
        what = f"once every {self.every} calls" if self.every else "never"
        return f"{self.target} runs {what} ({', '.join(self.patched) or 'not found yet'})"

    def state(self) -> str:
        """The step log's line once the target has been called: whether the fix acts."""
        return f"# applied: {self.describe()}"

    def _say(self, line: str) -> None:
        if line != self.said:
            self.said = line
            self.note(line)


def install(
    torch: Any, target: str, every: int, note: Callable[[str], None], site: CallSite | None = None
) -> CallSite:
    """Patch `target` now or, once the job defines it, on a forward or an optimizer step
    (`site`: the fix's own call site, a Memo; else thin or skip by `every`)."""
    from torch.nn.modules import module as nn_module
    from torch.optim.optimizer import register_optimizer_step_post_hook

    site = site or CallSite(target, every, note)
    site.look()
    last = [0.0]

    def tick(*_args: object) -> None:
        now = time.monotonic()
        if now - last[0] >= RETRY_S:
            last[0] = now
            site.tick()

    nn_module.register_module_forward_pre_hook(lambda module, args: tick())
    register_optimizer_step_post_hook(lambda opt, args, kwargs: tick())
    return site


# The memo (`cache:MODULE.FUNCTION`): a call whose arguments match an earlier call's returns
# that call's result. Arguments are compared as a cache of the function would have to: numbers,
# strings, None and their tuples, lists and dicts by value; a tensor by identity and version
# (the same tensor, not written since), else by value where it has at most VALUE_MAX elements
# (a copy kept); any other object by identity (a method's `self`: a change of its state is not
# seen). A result holding a tensor that needs a gradient is not kept (its graph is freed by the
# backward), nor one written in place since it was returned (the caller changed it).
MEMO_KEPT = 8  # argument sets kept, the oldest dropped
VALUE_MAX = 1 << 16  # a tensor argument compared by value up to this many elements
MEMO_CALLS = 10  # calls before the hit rate says whether the cache serves the job
MEMO_HITS = 0.5  # the least share of calls served for the trial to time a cache
DEPTH = 4  # nesting of containers read in arguments


class _Uncacheable(Exception):
    """An argument or a result a cache cannot hold honestly."""


def _tensor_type() -> type | None:
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _arg_key(value: object, tensor: type | None, depth: int = 0) -> object:
    """What a cache compares of one argument: scalars by value, a tensor by identity and
    version (and its value where small: `_Value`), other objects by identity."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return (type(value).__name__, value)
    if tensor is not None and isinstance(value, tensor):
        return _Value(value)
    if depth >= DEPTH:
        raise _Uncacheable("arguments nested too deep")
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_arg_key(v, tensor, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), _arg_key(v, tensor, depth + 1)) for k, v in value.items()))
    return ("id", id(value), type(value).__qualname__)


class _Value:
    """A tensor argument: equal to another when it is the same tensor unchanged (identity,
    storage and version), or of the same dtype, shape and values (small tensors only)."""

    def __init__(self, t: Any) -> None:
        try:
            self.ptr = t.data_ptr()
        except Exception as exc:  # a tensor with no storage of its own (meta, sparse)
            raise _Uncacheable(f"a tensor argument without storage ({exc})") from None
        self.ref, self.id, self.version = t, id(t), t._version
        self.shape, self.dtype = tuple(t.shape), t.dtype
        self.copy: Any = None  # its values, taken once the key is kept (`keep`)

    def keep(self) -> None:
        """Take a copy of a small tensor's values (a later call's new tensor of the same
        values then matches)."""
        if self.ref.numel() <= VALUE_MAX:
            self.copy = self.ref.detach().clone()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Value):
            return False
        if (self.id, self.ptr, self.version) == (other.id, other.ptr, other.version):
            return other.ref is self.ref
        if self.copy is None or (self.shape, self.dtype) != (other.shape, other.dtype):
            return False
        import torch

        return bool(torch.equal(self.copy, other.ref.detach()))

    def __hash__(self) -> int:
        return hash((self.shape, str(self.dtype)))


def _keep_values(key: object, depth: int = 0) -> None:
    """`keep` every tensor argument of a key being stored."""
    if isinstance(key, _Value):
        key.keep()
    elif isinstance(key, tuple) and depth <= 2 * DEPTH + 2:
        for part in key:
            _keep_values(part, depth + 1)


def _result_tensors(value: object, tensor: type | None, depth: int = 0) -> list:
    if tensor is not None and isinstance(value, tensor):
        return [value]
    if depth < DEPTH and isinstance(value, (tuple, list)):
        return [t for v in value for t in _result_tensors(v, tensor, depth + 1)]
    if depth < DEPTH and isinstance(value, dict):
        return [t for v in value.values() for t in _result_tensors(v, tensor, depth + 1)]
    return []


class Memo(CallSite):
    """The cache fix of one named function: each call's arguments compared with the earlier
    calls' (see `_arg_key`); a match returns the result kept; hits, misses and calls it could
    not keep counted, and the hit rate said in the step log."""

    def __init__(self, target: str, note: Callable[[str], None]) -> None:
        super().__init__(target, 0, note)
        self.kept: list[tuple[object, object, list[tuple[Any, int]]]] = []  # key, result, versions
        self.hits = self.misses = 0
        self.unkept: dict[str, int] = {}  # why a call's result was not kept -> calls

    def call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """One call: the kept result of an earlier call with the same arguments, else run it."""
        self.calls += 1
        tensor = _tensor_type()
        try:
            key = (_arg_key(args, tensor), _arg_key(sorted(kwargs.items()), tensor))
        except _Uncacheable as exc:
            return self._run(fn, args, kwargs, None, str(exc))
        for i, (k, result, versions) in enumerate(self.kept):
            if k == key:
                if all(t._version == v for t, v in versions):
                    self.hits += 1
                    return result
                del self.kept[i]  # the caller wrote into the result: run it again
                return self._run(fn, args, kwargs, key, "its result was written in place")
        return self._run(fn, args, kwargs, key, None)

    def _run(
        self, fn: Callable[..., Any], args: tuple, kwargs: dict, key: object, why: str | None
    ) -> Any:
        self.misses += 1
        self.ran += 1
        result = fn(*args, **kwargs)
        tensors = _result_tensors(result, _tensor_type())
        if why is None and any(getattr(t, "requires_grad", False) for t in tensors):
            why = "its result needs a gradient"
        if why is not None or key is None:
            self.unkept[why or "uncacheable"] = self.unkept.get(why or "uncacheable", 0) + 1
            return result
        _keep_values(key)
        self.kept.append((key, result, [(t, t._version) for t in tensors]))
        del self.kept[:-MEMO_KEPT]
        return result

    def describe(self) -> str:
        return (
            f"{self.target} returns its kept result when called again with the same arguments "
            f"({', '.join(self.patched) or 'not found yet'})"
        )

    def state(self) -> str:
        """Applied with its hit rate; not applied once MEMO_CALLS calls show most calls miss."""
        rate = self.hits / self.calls if self.calls else 0.0
        counted = (
            f"{self.hits} of {self.calls} calls served from the cache ({rate:.0%}), "
            f"{len(self.kept)} argument set(s) kept"
        )
        if self.unkept:
            why, n = max(self.unkept.items(), key=lambda kv: kv[1])
            counted += f"; {n} result(s) not kept: {why}"
        if self.calls >= MEMO_CALLS and rate < MEMO_HITS:
            return (
                f"# not applied: {self.target}'s arguments or results do not repeat: {counted}; "
                "a cache of it would not serve this job, and timing it would time another job"
            )
        return f"# applied: {self.describe()}: {counted}"


# The swap (`swap:MODULE.FUNCTION:with=OTHER.FUNCTION`): the named function's calls run a
# replacement the user wrote (a vectorised loop, a fused attention), with the same arguments, so
# that a rewrite is timed without editing the job. On its first SWAP_CHECKS calls the original
# runs too (without a gradient) and the two results must be equal (SWAP_RTOL, SWAP_ATOL);
# otherwise the original runs from then on and the step log says why ("# not applied").
SWAP_CHECKS = 3
SWAP_RTOL, SWAP_ATOL = 1e-4, 1e-5


def _differs(got: Any, want: Any, depth: int = 0) -> str | None:
    """Why two results are not the same result (None: they are): tensors of one shape and
    dtype, equal within the tolerance; containers item by item; anything else by ==."""
    tensor = _tensor_type()
    if tensor is not None and isinstance(want, tensor):
        return _tensor_differs(got, want, tensor)
    if isinstance(want, (tuple, list, dict)) and depth < DEPTH:
        if type(got) is not type(want) or len(got) != len(want):
            return f"a {type(want).__name__} of {len(want)} became {type(got).__name__}"
        if isinstance(want, dict):
            if set(got) != set(want):
                return "a dict with other keys"
            pairs = [(got[k], w) for k, w in want.items()]
        else:
            pairs = list(zip(got, want, strict=True))
        return next((w for w in (_differs(g, v, depth + 1) for g, v in pairs) if w), None)
    try:
        return None if bool(got == want) else f"{type(want).__name__} {want!r:.60} differs"
    except Exception:
        return f"a {type(want).__name__} that cannot be compared"


def _tensor_differs(got: Any, want: Any, tensor: Any) -> str | None:
    if not isinstance(got, tensor) or got.shape != want.shape or got.dtype != want.dtype:
        return f"a tensor of {tuple(want.shape)} {want.dtype} became {_shape(got)}"
    import torch

    if not torch.allclose(got.detach(), want.detach(), rtol=SWAP_RTOL, atol=SWAP_ATOL):
        gap = float((got.detach() - want.detach()).abs().max())
        return f"its values differ (by up to {gap:.3g})"
    return None


def _shape(value: object) -> str:
    shape = getattr(value, "shape", None)
    return f"{tuple(shape)} {getattr(value, 'dtype', '')}" if shape is not None else "not one"


def _importable(target: str) -> None:
    """Import the module a replacement's dotted name starts with, where it is not loaded yet:
    by its name, else a file of that stem in the job's working folder."""
    import importlib
    import importlib.util

    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:i])
        if _modules(name):
            return
        try:
            importlib.import_module(name)
            return
        except Exception:
            pass
    path = os.path.join(os.getcwd(), parts[0] + ".py")
    if os.path.isfile(path):
        spec = importlib.util.spec_from_file_location(parts[0], path)
        if spec is not None and spec.loader is not None:
            mod = importlib.util.module_from_spec(spec)
            sys.modules[parts[0]] = mod
            spec.loader.exec_module(mod)


class Swap(CallSite):
    """The swap fix of one named function: its calls run `replacement` instead, checked equal
    to the original on the first SWAP_CHECKS calls."""

    def __init__(self, target: str, replacement: str, note: Callable[[str], None]) -> None:
        super().__init__(target, 0, note)
        self.replacement = replacement
        self.repl: Callable[..., Any] | None = None
        self.checked = 0
        self.off: str | None = None

    def find(self) -> Callable[..., Any] | None:
        """The replacement function, imported where it is not loaded yet."""
        if self.repl is None:
            try:
                _importable(self.replacement)
            except Exception as exc:  # its module failed to import: said, the original runs
                self.off = f"{self.replacement} could not be imported ({exc!r:.120})"
                return None
            found = [obj for _, _, obj in by_attribute(self.replacement) if callable(obj)]
            if not found:
                self.off = (
                    f"no function {self.replacement} found (a module the job can import, or a "
                    "file of that name in its working folder)"
                )
                return None
            self.repl = found[0]
        return self.repl

    def call(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        self.calls += 1
        repl = None if self.off else self.find()
        if repl is None:
            return fn(*args, **kwargs)
        if self.checked >= SWAP_CHECKS:
            self.ran += 1
            return repl(*args, **kwargs)
        got = repl(*args, **kwargs)
        import torch

        with torch.no_grad():
            want = fn(*args, **kwargs)
        why = _differs(got, want)
        if why:
            self.off = f"{self.replacement}'s result is not {self.target}'s: {why}"
            self._say(self.state())
            return fn(*args, **kwargs)
        self.checked += 1
        self.ran += 1
        return got

    def describe(self) -> str:
        return (
            f"{self.target} runs {self.replacement} in its place "
            f"({', '.join(self.patched) or 'not found yet'})"
        )

    def state(self) -> str:
        if self.off:
            return f"# not applied: {self.off}"
        return (
            f"# applied: {self.describe()}: {self.ran} of {self.calls} calls, the first "
            f"{self.checked} checked equal to the original's"
        )
