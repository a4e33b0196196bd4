"""`gpudiag try`: apply one fix inside the job, from GPUDIAG_FIX, and time its steps.

Runs inside the training job and imports nothing from gpudiag. GPUDIAG_FIX holds
{"kind": ..., "values": {...}}; GPUDIAG_TRY_STEPS names a file that gets one wall-clock time
per optimizer step (the trial's step rate). The user's files are never touched: every fix
is a patch of this process only. Kinds:

- dataloader: num_workers, pin_memory, persistent_workers, prefetch_factor set in
  DataLoader.__init__ (persistent_workers and prefetch_factor only when workers > 0);
- optimizer: foreach / fused, where the optimizer class takes the argument;
- cudnn_benchmark: torch.backends.cudnn.benchmark = True;
- tf32: TF32 matmul/cuDNN and float32 matmul precision "high" (changes numerics: the
  trial sets it only with --allow-numerics);
- compile: torch.compile of the first module whose forward runs (opt-in);
- checkpoint: only every `every`-th torch.save runs; the last skipped one runs at exit;
- inference_mode: the model's outermost forwards run under torch.inference_mode() where
  autograd was on (a job that never runs a backward: INFER001);
- batch: every DataLoader's batch_size times `factor` (an inference loop's batch).

A job with no optimizer step (batch inference) is timed by its outermost forwards instead:
one line "f TIME ITEMS" a forward, ITEMS its batch size (the trial's rate is then items/s);
the forward clock stops at a first optimizer step, so a training job is timed as before.
"""

from __future__ import annotations

import atexit
import inspect
import json
import os
import sys
import time
from typing import Any

FIX_ENV = "GPUDIAG_FIX"
STEPS_ENV = "GPUDIAG_TRY_STEPS"
FLUSH_S = 0.5
APPLIED: list[str] = []  # what was set, for the trial's log


def _say(text: str) -> None:
    APPLIED.append(text)
    print(f"gpudiag try: {text}", file=sys.stderr, flush=True)


def dataloader(torch, values: dict) -> None:
    """Patch DataLoader.__init__ so every loader gets the fix's values."""
    from torch.utils.data import DataLoader

    orig = DataLoader.__init__

    def __init__(self, *args, **kwargs):
        kw = dict(kwargs)
        if "num_workers" in values:
            kw["num_workers"] = int(values["num_workers"])
        workers = kw.get("num_workers", 0)
        if "pin_memory" in values:
            kw["pin_memory"] = bool(values["pin_memory"])
        if workers > 0 and "persistent_workers" in values:
            kw["persistent_workers"] = bool(values["persistent_workers"])
        if workers > 0 and "prefetch_factor" in values:
            kw["prefetch_factor"] = int(values["prefetch_factor"])
        try:
            orig(self, *args, **kw)
        except (TypeError, ValueError):
            orig(self, *args, **kwargs)  # this torch refuses a value: the job as it was
            _say(f"DataLoader refused {values}; left as written")

    DataLoader.__init__ = __init__
    _say(f"DataLoader({', '.join(f'{k}={v}' for k, v in values.items())})")


def optimizer(torch, values: dict) -> None:
    """Give foreach/fused to every optimizer class whose constructor takes them."""
    wanted = {k: bool(v) for k, v in values.items() if k in ("foreach", "fused")}
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            continue
        if cls is torch.optim.Optimizer:
            continue
        try:
            params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]  # a patch
        except (TypeError, ValueError):
            continue
        take = {k: v for k, v in wanted.items() if k in params}
        if not take:
            continue
        orig = cls.__init__  # type: ignore[misc]  # the constructor this patch wraps

        def __init__(self, *args, _orig=orig, _take=take, **kwargs):
            _orig(self, *args, **{**kwargs, **_take})

        cls.__init__ = __init__  # type: ignore[misc]  # the patch itself
    _say(f"optimizers: {wanted}")


def cudnn_benchmark(torch, values: dict) -> None:
    """Let cuDNN pick the fastest algorithm per input shape."""
    torch.backends.cudnn.benchmark = True
    _say("torch.backends.cudnn.benchmark = True")


def tf32(torch, values: dict) -> None:
    """TF32 matmul and convolutions (changes numerics)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    _say("TF32 on (torch.set_float32_matmul_precision('high'))")


def compile_module(torch, values: dict) -> None:
    """torch.compile the first top-level module called (its forward replaced in place)."""
    done: list[object] = []
    orig_call = torch.nn.Module.__call__

    def __call__(self, *args, **kwargs):
        if not done:
            done.append(self)
            torch.nn.Module.__call__ = orig_call
            t0 = time.perf_counter()
            self.forward = torch.compile(self.forward)
            out = orig_call(self, *args, **kwargs)
            _say(
                f"torch.compile({type(self).__name__}): first call {time.perf_counter() - t0:.1f} s"
            )
            return out
        return orig_call(self, *args, **kwargs)

    torch.nn.Module.__call__ = __call__
    _say("torch.compile of the top-level module")


def checkpoint(torch, values: dict) -> None:
    """Only every k-th torch.save runs; a skipped last save runs at exit (none is lost)."""
    every = max(1, int(values.get("every", 2)))
    orig = torch.save
    state: dict[str, Any] = {"n": 0, "skipped": None}

    def save(obj, f, *args, **kwargs):
        state["n"] += 1
        if state["n"] % every == 0:
            state["skipped"] = None
            return orig(obj, f, *args, **kwargs)
        state["skipped"] = (obj, f, args, kwargs)
        return None

    def last() -> None:
        if state["skipped"] is not None:
            obj, f, args, kwargs = state["skipped"]
            try:
                orig(obj, f, *args, **kwargs)
            except Exception as exc:
                print(f"gpudiag try: final save failed: {exc}", file=sys.stderr)

    torch.save = save
    atexit.register(last)
    _say(f"torch.save runs every {every}th time (the last one always)")


def inference_mode(torch, values: dict) -> None:
    """Run each thread's outermost module call under torch.inference_mode() when autograd is
    on there (nested calls and calls already without autograd are left as they are)."""
    import threading

    orig_call = torch.nn.Module.__call__
    local = threading.local()

    def __call__(self, *args, **kwargs):
        if getattr(local, "inside", False) or not torch.is_grad_enabled():
            return orig_call(self, *args, **kwargs)
        local.inside = True
        try:
            with torch.inference_mode():
                return orig_call(self, *args, **kwargs)
        finally:
            local.inside = False

    torch.nn.Module.__call__ = __call__
    _say("the model's outermost forwards under torch.inference_mode()")


def batch(torch, values: dict) -> None:
    """Every DataLoader built with a batch size (no batch_sampler) gets `factor` times it."""
    from torch.utils.data import DataLoader

    factor = max(1, int(values.get("factor", 2)))
    orig = DataLoader.__init__

    def __init__(self, *args, **kwargs):
        a, kw = list(args), dict(kwargs)
        if len(a) >= 2 and isinstance(a[1], int):
            a[1] *= factor
        elif kw.get("batch_sampler") is None and "batch_size" not in kw and len(a) < 2:
            kw["batch_size"] = factor  # DataLoader's default batch_size is 1
        elif isinstance(kw.get("batch_size"), int):
            kw["batch_size"] *= factor
        orig(self, *a, **kw)

    DataLoader.__init__ = __init__
    _say(f"DataLoader batch_size x{factor}")


KINDS = {
    "dataloader": dataloader,
    "optimizer": optimizer,
    "cudnn_benchmark": cudnn_benchmark,
    "tf32": tf32,
    "compile": compile_module,
    "checkpoint": checkpoint,
    "inference_mode": inference_mode,
    "batch": batch,
}


class _Steps:
    """Wall-clock time of each optimizer step, appended to a file every 0.5 s."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: list[str] = []
        self.last = time.monotonic()

    def on_step(self) -> None:
        self.rows.append(f"{time.time():.6f}")
        if time.monotonic() - self.last >= FLUSH_S:
            self.flush()

    def on_forward(self, items: float) -> None:
        self.rows.append(f"f {time.time():.6f} {items:g}")
        if time.monotonic() - self.last >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        if not self.rows:
            return
        try:
            with open(self.path, "a") as f:
                f.write("".join(f"{row}\n" for row in self.rows))
        except OSError:
            pass
        self.rows = []


def under_try() -> bool:
    """Whether this job was started by `gpudiag try`: GPUDIAG_TRY_STEPS names a file in a
    folder private to this user (the trial's own). A stale GPUDIAG_FIX left in the
    environment of an ordinary run skipped the job's checkpoints."""
    path = os.environ.get(STEPS_ENV)
    if not path:
        return False
    try:
        from . import gpudiag_channel
    except ImportError:  # loaded as a top-level module by sitecustomize
        import gpudiag_channel
    return gpudiag_channel.private_path(path)


def install(torch) -> None:
    """Apply GPUDIAG_FIX and start the step log, under `gpudiag try` only."""
    if not under_try():
        return
    spec = os.environ.get(FIX_ENV)
    if spec:
        try:
            fix = json.loads(spec)
            KINDS[fix["kind"]](torch, fix.get("values") or {})
        except Exception as exc:  # never break the job's other hooks; the trial sees it
            print(f"gpudiag try: fix not applied: {exc!r}", file=sys.stderr)
            spec = None
    path = os.environ.get(STEPS_ENV)
    if path:
        if spec:
            with open(path, "a") as f:  # the trial checks the fix was applied
                f.write(f"# applied: {'; '.join(APPLIED)}\n")
        steps = _Steps(path)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        clock = _forward_clock(torch, steps)
        register_optimizer_step_post_hook(lambda opt, args, kwargs: steps.on_step())
        register_optimizer_step_post_hook(lambda opt, args, kwargs: clock.stop())
        atexit.register(steps.flush)


class _Clock:
    """The forward clock's hooks, removed at the first optimizer step."""

    def __init__(self, handles: list) -> None:
        self.handles = handles

    def stop(self) -> None:
        while self.handles:
            self.handles.pop().remove()


def _forward_clock(torch, steps: _Steps) -> _Clock:
    """Time each thread's outermost forward (and its batch size) on the step file."""
    import threading

    from torch.nn.modules import module as nn_module

    local = threading.local()

    def pre(module, args):
        local.depth = getattr(local, "depth", 0) + 1

    def post(module, args, *rest):
        # (kwargs, output); (output,) alone when the forward raised
        local.depth = max(0, getattr(local, "depth", 1) - 1)
        if local.depth == 0:
            kwargs = rest[0] if len(rest) == 2 and isinstance(rest[0], dict) else {}
            inputs = list(args) + list(kwargs.values())
            first = next((a for a in inputs if hasattr(a, "shape")), None)
            shape = getattr(first, "shape", None)
            steps.on_forward(float(shape[0]) if shape is not None and len(shape) else 1.0)

    return _Clock(
        [
            nn_module.register_module_forward_pre_hook(pre),
            nn_module.register_module_forward_hook(post, with_kwargs=True, always_call=True),
        ]
    )
