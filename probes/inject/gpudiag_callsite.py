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
            self._say(f"# applied: {self.describe()}")
        elif self.patched_at is not None and time.monotonic() - self.patched_at >= NOTE_AFTER_S:
            self._say(
                f"# not applied: {', '.join(self.patched)} was never called since it was "
                "patched (a built-in held under another name is not reached)"
            )

    def describe(self) -> str:
        what = f"once every {self.every} calls" if self.every else "never"
        return f"{self.target} runs {what} ({', '.join(self.patched) or 'not found yet'})"

    def _say(self, line: str) -> None:
        if line != self.said:
            self.said = line
            self.note(line)


def install(torch: Any, target: str, every: int, note: Callable[[str], None]) -> CallSite:
    """Patch `target` now or, once the job defines it, on a forward or an optimizer step."""
    from torch.nn.modules import module as nn_module
    from torch.optim.optimizer import register_optimizer_step_post_hook

    site = CallSite(target, every, note)
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
