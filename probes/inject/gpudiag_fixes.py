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
- checkpoint: only every `every`-th torch.save runs, each through a temporary file renamed
  over the target; only a save over this process's own complete earlier save is skipped (the
  code after a save may move or read its file); the last skipped one runs at exit or SIGTERM;
- inference_mode: the model's outermost forwards run under torch.inference_mode() where
  autograd was on (a job that never runs a backward: INFER001);
- batch: every DataLoader's batch_size times `factor` (an inference loop's batch);
- anomaly_off: autograd's anomaly detection kept off (`torch.autograd.set_detect_anomaly(True)`,
  `detect_anomaly()` and Lightning's `Trainer(detect_anomaly=True)` turn nothing on: DEBUG001);
- padding: a Hugging Face tokenizer asked for `padding="max_length"` with tensors returned
  pads each call to its longest row instead (INFER003); patched at the first model forward,
  once transformers is loaded; and a DataLoader's batch that is a dict with a 2-D
  `attention_mask` has the columns no row uses cut from its [rows, length] tensors (a dataset
  padded once by `map()`, collated as it is: what `DataCollatorWithPadding` gives);
- settings: torch's global settings held at the values given (anomaly, deterministic,
  cudnn_deterministic, cudnn_benchmark: true/false): DEBUG001's switches off;
- freeze: the model's module at the dotted path `target` (`backbone`, `layers.0`) stops
  training: requires_grad_(False) on its parameters at the model's first forward (no gradient
  computed for it, no update): COMP001's parameters given a gradient nobody takes;
- reuse: the model's module at `target` returns its last output when called again on the same
  unchanged input (in the same step; across steps too where its output needs no gradient):
  COMP001's second call on the same input, or a constant recomputed every step;
- select: the model's module at `target` computes only the outputs the loss reads, `length`
  positions from `start` along its output's `dim` (by its input's positions; along its last
  dim, a Linear's features: the layer narrowed to the rows of its weight read, the optimizer's
  parameters and state too, once SELECT_CHECKS backwards showed the gradient zero elsewhere),
  the others a broadcast of them or zeros; checked as it runs (its full output equal at the
  selection on the first call, a zero gradient at the positions left out on the first
  backwards), "# not applied" when either fails: COMP001's outputs nobody reads;
- batched: the model's module at `target`, called on slices of one batch along its input's
  first dim (a loop over samples), computed once on the whole batch, its slices handed to the
  calls; learnt from a step before it acts and checked as it runs (gpudiag_batched), "# not
  applied" where the calls are no loop over a batch or the module mixes samples: COMP001's
  unit called many times a step;
- recompute_off: activation checkpointing off: `torch.utils.checkpoint.checkpoint` calls its
  function directly (the activations kept, no forward recomputed in the backward), for every
  holder that looks it up after the hooks load (Hugging Face's gradient_checkpointing, timm,
  checkpoint_sequential, the job's own `from torch.utils.checkpoint import checkpoint`):
  COMP001's recompute;
- thin: the function named by `target` (MODULE.FUNCTION) runs only every `every`-th call,
  the calls between return its last result; skip: it never runs (its calls return None): a
  trial for any call site (gpudiag_callsite);
- swap: the function named by `target` runs the function `with` names (a rewrite the user
  wrote, in a module the job can import or a file in its working folder) in its place, checked
  equal to the original on its first calls (gpudiag_callsite.Swap);
- cache: the function named by `target` returns its kept result when called again with the
  same arguments (compared as a cache would: gpudiag_callsite.Memo), its hit rate in the step
  log; "# not applied" once most of its calls miss (a function whose arguments change);

Every arm (as it is too) runs under gpudiag_guard when GPUDIAG_TRY_GUARD is set: a write over a
file the job had under its folders before the trial is refused ("# refused: ..." in the log).

A job with no optimizer step (batch inference) is timed by its outermost forwards instead:
one line "f TIME ITEMS" a forward, ITEMS its batch size (the trial's rate is then items/s);
the forward clock stops at a first optimizer step, so a training job is timed as before.
"""

from __future__ import annotations

import atexit
import inspect
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

try:
    from . import gpudiag_batched as _batched
    from . import gpudiag_callsite as _callsite
    from . import gpudiag_channel as _channel
    from . import gpudiag_guard as _guard
    from . import gpudiag_serve as _serve
except ImportError:  # loaded as a top-level module by sitecustomize
    import gpudiag_batched as _batched
    import gpudiag_callsite as _callsite
    import gpudiag_channel as _channel
    import gpudiag_guard as _guard
    import gpudiag_serve as _serve

FIX_ENV = _channel.FIX_ENV
STEPS_ENV = _channel.STEPS_ENV
FLUSH_S = 0.5
APPLIED: list[str] = []  # what was set, for the trial's log
NOTES: list[str] = []  # lines for the step log found as the job ran ("# not applied: ...")
END: list = []  # what runs at exit (and, under the checkpoint fix, on SIGTERM), in order


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _umask()


def _say(text: str) -> None:
    APPLIED.append(text)
    sys.stderr.write(f"gpudiag try: {text}\n")  # not print(): a trial may thin print itself
    sys.stderr.flush()


def dataloader(torch: Any, values: dict) -> None:
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


def optimizer(torch: Any, values: dict) -> None:
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


def cudnn_benchmark(torch: Any, values: dict) -> None:
    """Let cuDNN pick the fastest algorithm per input shape."""
    torch.backends.cudnn.benchmark = True
    _say("torch.backends.cudnn.benchmark = True")


def tf32(torch: Any, values: dict) -> None:
    """TF32 matmul and convolutions (changes numerics)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    _say("TF32 on (torch.set_float32_matmul_precision('high'))")


def compile_module(torch: Any, values: dict) -> None:
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


def _fsync_dir(folder: str) -> None:
    """Make a rename in `folder` durable (where the filesystem allows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_save(
    orig: Callable[..., Any], obj: object, path: str, args: tuple, kwargs: dict
) -> None:
    """torch.save to `path` through a temporary file in its folder, fsync'd, then renamed
    over it: a job killed mid-save leaves the old checkpoint or the new one, never a torn one.
    The file gets the mode a plain torch.save would give it."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~UMASK)
        with os.fdopen(fd, "wb") as fh:
            orig(obj, fh, *args, **kwargs)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)


class _Saves:
    """The checkpoint fix's state: only every k-th torch.save runs, and only a save over a
    complete checkpoint this process wrote there is skipped (the code after a save may move or
    read its file: timm's save-then-rename crashed on a skipped save's missing file)."""

    def __init__(self, orig: Callable[..., Any], every: int) -> None:
        self.orig, self.every = orig, every
        self.n = self.skips = 0
        self.told = False
        self.pending: tuple | None = None
        self.written: dict[str, tuple[int, int]] = {}  # path -> (device, inode) we saved

    def _own(self, path: str) -> bool:
        try:
            st = os.stat(path)
        except OSError:
            return False
        return self.written.get(path) == (st.st_dev, st.st_ino)

    def write(self, obj: object, f: Any, args: tuple, kwargs: dict) -> None:
        if not isinstance(f, (str, os.PathLike)):
            self.orig(obj, f, *args, **kwargs)  # a buffer or a handle: the caller's to close
            return
        path = os.fspath(f)
        atomic_save(self.orig, obj, path, args, kwargs)
        st = os.stat(path)
        self.written[path] = (st.st_dev, st.st_ino)

    def save(self, obj, f, *args, **kwargs):
        self.n += 1
        path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
        if self.n % self.every == 0 or path is None or not self._own(path):
            if self.n % self.every and self.n > self.every and not self.skips and not self.told:
                self.told = True  # a whole round of saves, each to a new file
                NOTES.append(
                    f"# not applied: torch.save #{self.n} wrote a new file, which the code "
                    "after it may move or read (save-then-rename): it ran"
                )
            self.pending = None
            return self.write(obj, f, args, kwargs)
        if not self.skips and self.told:
            NOTES.append(f"# applied: {'; '.join(APPLIED)}")
        self.skips += 1
        self.pending = (obj, f, args, kwargs)
        return None

    def last(self) -> None:
        """The last skipped save, at exit (or SIGTERM): none is lost."""
        pending, self.pending = self.pending, None
        if pending is not None:
            obj, f, args, kwargs = pending
            try:
                self.write(obj, f, args, kwargs)
            except Exception as exc:
                print(f"gpudiag try: final save failed: {exc}", file=sys.stderr)


def _end() -> None:
    """What the fix and the step log do at the end, once, in order."""
    while END:
        END.pop(0)()


def _on_sigterm() -> None:
    """Run the last skipped save on SIGTERM too (try stops each arm with it), then die of
    the signal as before; only where the job left SIGTERM to its default."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def handler(signum, frame):
        _end()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


def checkpoint(torch: Any, values: dict) -> None:
    """Only every k-th torch.save runs (save-then-rename); a skipped last save runs at exit."""
    saves = _Saves(torch.save, max(1, int(values.get("every", 2))))
    torch.save = saves.save
    END.append(saves.last)
    _on_sigterm()
    _say(f"torch.save runs every {saves.every}th time, atomically (the last one always)")


def inference_mode(torch: Any, values: dict) -> None:
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


def anomaly_off(torch: Any, values: dict) -> None:
    """Keep autograd's anomaly detection off: every call that sets it (set_detect_anomaly,
    detect_anomaly, Lightning's Trainer) sets it off instead."""
    orig = torch.set_anomaly_enabled

    def set_anomaly_enabled(enabled, *args, **kwargs):
        return orig(False, *args, **kwargs)

    torch.set_anomaly_enabled = set_anomaly_enabled
    orig(False)
    _say("autograd anomaly detection kept off")


def settings(torch: Any, values: dict) -> None:
    """torch's global settings held at the fix's values (anomaly, deterministic,
    cudnn_deterministic off; cudnn_benchmark on or off): set now, their setters made to keep
    them, and set again at each optimizer step (a flag the job assigns after the hooks load)."""
    want = {k: bool(v) for k, v in values.items()}
    if "anomaly" in want:
        orig_anomaly = torch.set_anomaly_enabled
        torch.set_anomaly_enabled = lambda enabled, *a, **k: orig_anomaly(want["anomaly"], *a, **k)
    if "deterministic" in want:
        orig_det = torch.use_deterministic_algorithms
        torch.use_deterministic_algorithms = lambda mode, *a, **k: orig_det(
            want["deterministic"], *a, **k
        )

    def hold(*_args: object) -> None:
        if "anomaly" in want and torch.is_anomaly_enabled() != want["anomaly"]:
            orig_anomaly(want["anomaly"])
        if "deterministic" in want:
            if torch.are_deterministic_algorithms_enabled() != want["deterministic"]:
                orig_det(want["deterministic"])
        if "cudnn_deterministic" in want:
            torch.backends.cudnn.deterministic = want["cudnn_deterministic"]
        if "cudnn_benchmark" in want:
            torch.backends.cudnn.benchmark = want["cudnn_benchmark"]

    hold()
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda opt, args, kwargs: hold())
    _say(f"torch settings held: {', '.join(f'{k}={v}' for k, v in want.items())}")


def batch(torch: Any, values: dict) -> None:
    """Every DataLoader built with a batch size (no batch_sampler) gets `factor` times it; a
    Hugging Face pipeline's call its `batch_size` times it (its loader's collate takes one
    item at batch 1: the pipeline picks its padding collate for the larger batch)."""
    from torch.utils.data import DataLoader

    factor = max(1, int(values.get("factor", 2)))
    orig = DataLoader.__init__

    def __init__(self, *args, **kwargs):
        if getattr(_IN_PIPELINE, "on", False):  # its batch is already the pipeline's
            return orig(self, *args, **kwargs)
        a, kw = list(args), dict(kwargs)
        if len(a) >= 2 and isinstance(a[1], int):
            a[1] *= factor
        elif kw.get("batch_sampler") is None and "batch_size" not in kw and len(a) < 2:
            kw["batch_size"] = factor  # DataLoader's default batch_size is 1
        elif isinstance(kw.get("batch_size"), int):
            kw["batch_size"] *= factor
        orig(self, *a, **kw)

    DataLoader.__init__ = __init__
    _serve.when_imported(
        "transformers.pipelines.base", lambda module, _rec: _batch_pipelines(module, factor)
    )
    _say(f"DataLoader batch_size x{factor} (a Hugging Face pipeline's batch_size x{factor})")


_IN_PIPELINE = threading.local()  # inside a pipeline's get_iterator (its loader is its own)


def _batch_pipelines(module: Any, factor: int) -> None:
    """A Hugging Face pipeline's iterator over many inputs at `factor` times its batch_size
    (its DataLoader built inside it is left as the pipeline asks): `Pipeline`'s and
    `ChunkPipeline`'s (question answering, zero-shot, long audio: its own iterator)."""
    for name in ("Pipeline", "ChunkPipeline"):
        cls = getattr(module, name, None)
        orig = None if cls is None else cls.__dict__.get("get_iterator")
        if cls is not None and callable(orig):
            cls.get_iterator = _batched_iterator(orig, factor)


def _batched_iterator(orig: Callable[..., Any], factor: int) -> Callable[..., Any]:
    def get_iterator(self, inputs, num_workers, batch_size, *args, **kwargs):
        _IN_PIPELINE.on = True
        try:
            return orig(self, inputs, num_workers, int(batch_size) * factor, *args, **kwargs)
        finally:
            _IN_PIPELINE.on = False

    return get_iterator


def _max_length(padding: object) -> bool:
    """Whether a tokenizer's `padding` argument asks for every row at max_length."""
    return padding == "max_length" or getattr(padding, "value", None) == "max_length"


class _Padding:
    """The padding fix: tokenizer calls rewritten to pad to their longest row."""

    def __init__(self) -> None:
        self.rewritten = 0
        self.trimmed = 0  # DataLoader batches cut to their longest row

    def patch(self) -> bool:
        """Wrap the tokenizers' __call__ once transformers has loaded them."""
        base = sys.modules.get("transformers.tokenization_utils_base")
        cls = getattr(base, "PreTrainedTokenizerBase", None)
        if cls is None:
            return False
        orig = cls.__call__

        def __call__(tok, *args, **kwargs):
            if kwargs.get("return_tensors") is not None and _max_length(kwargs.get("padding")):
                kwargs["padding"] = "longest"
                self.rewritten += 1
            return orig(tok, *args, **kwargs)

        cls.__call__ = __call__
        return True

    def at_end(self) -> None:
        if not self.rewritten and not self.trimmed:
            NOTES.append(
                '# not applied: no tokenizer call asked for padding="max_length" with tensors '
                "returned, and no DataLoader batch (a dict with an attention_mask) was padded "
                "past its longest row"
            )

    def trim(self, batch):
        """A batch dict with a 2-D attention mask: every [rows, length] tensor in it cut to
        the columns some row uses (the mask's first to last one); anything else as it is."""
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        shape = getattr(mask, "shape", None)
        if mask is None or shape is None or len(shape) != 2 or shape[1] < 2:
            return batch
        used = mask.ne(0).any(dim=0).nonzero()
        if used.numel() == 0:
            return batch
        first, last = int(used[0]), int(used[-1]) + 1
        if first == 0 and last == shape[1]:
            return batch
        self.trimmed += 1
        out = dict(batch)
        for k, v in batch.items():
            s = getattr(v, "shape", None)
            if s is not None and len(s) >= 2 and s[0] == shape[0] and s[1] == shape[1]:
                out[k] = v[:, first:last]
        try:
            return type(batch)(out)  # a BatchEncoding or another dict type, if it takes one
        except Exception:
            return out

    def patch_loader(self) -> None:
        """DataLoader iterators hand out trimmed batches."""
        from torch.utils.data import dataloader

        orig = dataloader._BaseDataLoaderIter.__next__
        fix = self

        def __next__(it):
            batch = orig(it)
            try:
                return fix.trim(batch)
            except Exception:
                return batch

        dataloader._BaseDataLoaderIter.__next__ = __next__


def _patch_once_loaded(patch: Callable[[], bool]) -> None:
    """Run `patch()` now, else before each model forward until it succeeds (it returns True
    once the library it wraps is loaded: transformers loads after torch)."""
    from torch.nn.modules import module as nn_module

    if patch():
        return
    handle: list = []

    def pre(module, args):
        if handle and patch():
            handle.pop().remove()

    handle.append(nn_module.register_module_forward_pre_hook(pre))


def padding(torch: Any, values: dict) -> None:
    """Tokenizers' padding="max_length" calls pad to each call's longest row (patched at the
    first model forward: transformers loads after torch)."""
    fix = _Padding()
    _patch_once_loaded(fix.patch)
    fix.patch_loader()
    END.append(fix.at_end)
    _say(
        "tokenizers' padding=\"max_length\" (with tensors) pads to each call's longest row; "
        "DataLoader batches with an attention_mask are cut to their longest row"
    )


# a model loaded with arguments seen before is the one loaded then, up to this many kept
LOADS_KEPT = 8


def _load_key(owner: object, args: tuple, kwargs: dict) -> str | None:
    """The cache key of a load: its class and its arguments' reprs (None when a repr fails
    or holds an object's address: nothing cached)."""
    try:
        key = f"{owner!r}|{args!r}|{sorted(kwargs.items())!r}"
    except Exception:
        return None
    return None if " at 0x" in key else key


# the from_pretrained classmethods the load-once fix wraps: (module, class defining it)
LOADERS = (
    ("transformers.modeling_utils", "PreTrainedModel"),
    ("transformers.models.auto.auto_factory", "_BaseAutoModelClass"),
    ("transformers.tokenization_utils_base", "PreTrainedTokenizerBase"),
    ("transformers.models.auto.tokenization_auto", "AutoTokenizer"),
)


class _Loads:
    """The load-once fix: the model loaders' results kept by their arguments."""

    def __init__(self) -> None:
        self.kept: dict[str, object] = {}
        self.reused = 0

    def get(self, owner: object, args: tuple, kwargs: dict, load: Callable[[], Any]) -> Any:
        """The load's result, loaded once per class and arguments."""
        key = _load_key(owner, args, kwargs)
        if key is None:
            return load()
        if key in self.kept:
            self.reused += 1
            return self.kept[key]
        got = load()
        if len(self.kept) < LOADS_KEPT:
            self.kept[key] = got
        return got

    def classmethod_(self, owner: type, name: str) -> None:
        """Wrap a from_pretrained classmethod defined on `owner`."""
        orig = owner.__dict__.get(name)
        if not isinstance(orig, classmethod):
            return
        func = orig.__func__

        def from_pretrained(cls, *args, **kwargs):
            return self.get(cls, args, kwargs, lambda: func(cls, *args, **kwargs))

        setattr(owner, name, classmethod(from_pretrained))

    def constructor(self, cls: Any) -> None:
        """Wrap a class's __init__: a second instance with the same arguments takes the first
        one's state (its modules, weights and settings), not a load of its own."""
        orig = cls.__init__
        loads = self

        def __init__(obj, *args, **kwargs):
            key = _load_key(cls, args, kwargs)
            first = loads.kept.get(key) if key is not None else None
            if first is None:
                orig(obj, *args, **kwargs)
                if key is not None and len(loads.kept) < LOADS_KEPT:
                    loads.kept[key] = obj
                return
            loads.reused += 1
            obj.__dict__.update(first.__dict__)

        cls.__init__ = __init__

    def patch(self) -> bool:
        """Wrap the loaders once transformers has loaded them."""
        if "transformers.modeling_utils" not in sys.modules:
            return False
        for module, cls in LOADERS:
            owner = getattr(sys.modules.get(module), cls, None)
            if owner is not None:
                self.classmethod_(owner, "from_pretrained")
        st = sys.modules.get("sentence_transformers.SentenceTransformer")
        if st is not None:
            self.constructor(st.SentenceTransformer)
        return True

    def at_end(self) -> None:
        if not self.reused:
            NOTES.append(
                "# not applied: no model was loaded twice with the same arguments (a loader "
                "other than from_pretrained or SentenceTransformer is not cached)"
            )


def load_once(torch: Any, values: dict) -> None:
    """A model loaded again with the same arguments (from_pretrained, SentenceTransformer) is
    the one loaded the first time (patched once transformers is loaded, at the latest at the
    first model forward; the loads before it run as they are)."""
    fix = _Loads()
    _patch_once_loaded(fix.patch)
    END.append(fix.at_end)
    _say("models loaded again with the same arguments reuse the first load")


def _log_line(line: str) -> None:
    """Append one line to the arm's step log now (a refusal, a call site's state)."""
    path = os.environ.get(STEPS_ENV)
    if not path:
        return
    try:
        with _OPEN(path, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


_OPEN = open  # the open() the job had: the guard's patch never sees the log's own writes


def thin(torch: Any, values: dict) -> None:
    """The function `target` runs every `every`-th call (the calls between return its last
    result)."""
    site = _callsite.install(torch, str(values["target"]), int(values.get("every", 2)), _log_line)
    _say(site.describe())


def skip(torch: Any, values: dict) -> None:
    """The function `target` never runs (its calls return None)."""
    site = _callsite.install(torch, str(values["target"]), 0, _log_line)
    _say(site.describe())


def swap(torch: Any, values: dict) -> None:
    """The function `target` runs the user's replacement `with` in its place, checked equal on
    its first calls; "# not applied" where it differs or is not found."""
    target = str(values["target"])
    site = _callsite.install(
        torch, target, 0, _log_line, _callsite.Swap(target, str(values["with"]), _log_line)
    )
    END.append(lambda: _log_line(site.state()) if site.calls else None)
    _say(site.describe())


def cache(torch: Any, values: dict) -> None:
    """The function `target` returns its kept result when called again with the same
    arguments; the step log says its hit rate, and "# not applied" once most calls miss."""
    target = str(values["target"])
    site = _callsite.install(torch, target, 0, _log_line, _callsite.Memo(target, _log_line))

    def at_end() -> None:  # its hit rate at the end
        if site.calls:
            _log_line(site.state())

    END.append(at_end)
    _say(site.describe())


MAX_LOOKS = 200  # model forwards looked at for a unit's path before saying it is missing


def _on_model(torch: Any, target: str, act: Any, root: list | None = None) -> None:
    """Call act(module) once, with the module at `target` under the first module to forward
    that has it (the model; a wrapper's `module.` prefix is part of the path); the model is
    appended to `root` first, where one is given."""
    from torch.nn.modules import module as nn_module

    first = target.split(".", 1)[0]
    state: dict[str, Any] = {"looks": 0, "handle": None}

    def pre(mod, args):
        if state["handle"] is None:
            return None
        if first not in getattr(mod, "_modules", {}):
            state["looks"] += 1
            if state["looks"] == MAX_LOOKS:
                _log_line(f"# not applied: no module {target} in the model's forwards")
            return None
        try:
            sub = mod.get_submodule(target)
        except Exception:
            return None
        state["handle"].remove()
        state["handle"] = None
        if root is not None:
            root.append(mod)
        act(sub)
        return None

    state["handle"] = nn_module.register_module_forward_pre_hook(pre)


def freeze(torch: Any, values: dict) -> None:
    """The module at `target` stops training: no gradient for its parameters, no update."""
    target = str(values["target"])

    def act(sub: Any) -> None:
        for p in sub.parameters():
            p.requires_grad_(False)
            p.grad = None

    _on_model(torch, target, act)
    _say(f"{target}'s parameters frozen (requires_grad_(False)) at the model's first forward")


def recompute_off(torch: Any, values: dict) -> None:
    """torch.utils.checkpoint.checkpoint calls its function directly: the forward's activations
    are kept and none is recomputed in the backward (gradient checkpointing off)."""
    import functools

    import torch.utils.checkpoint as ckpt

    orig = ckpt.checkpoint

    @functools.wraps(orig)
    def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
        for k in ("use_reentrant", "context_fn", "determinism_check", "debug", "early_stop"):
            kwargs.pop(k, None)
        kwargs.pop("preserve_rng_state", None)  # torch's own, not the function's
        return function(*args, **kwargs)

    ckpt.checkpoint = checkpoint
    _say("torch.utils.checkpoint.checkpoint calls its function directly (no recompute)")


def _input_key(args: Any) -> tuple | None:
    import torch

    for a in args[:4]:
        if isinstance(a, torch.Tensor):
            return (a.data_ptr(), tuple(a.shape), a.stride(), a._version)
    return None


def reuse(torch: Any, values: dict) -> None:
    """The module at `target` returns its last output for the same unchanged input: within an
    optimizer step always, across steps where the output needs no gradient."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    target = str(values["target"])
    state: dict = {"step": 0, "key": None, "out": None, "at": -1}
    register_optimizer_step_post_hook(
        lambda opt, a, k: state.__setitem__("step", state["step"] + 1)
    )

    def act(sub: Any) -> None:
        orig = sub.forward

        def forward(*args, **kwargs):
            key = None if kwargs else _input_key(args)
            out = state["out"]
            if key is not None and key == state["key"] and out is not None:
                grads = [t for t in _tensors(out) if t.requires_grad]
                if state["at"] == state["step"] or not grads:
                    return out
            out = orig(*args, **kwargs)
            state.update(key=key, out=out, at=state["step"])
            return out

        sub.forward = forward

    _on_model(torch, target, act)
    _say(f"{target} returns its last output for the same unchanged input")


SELECT_CHECKS = 3  # backwards whose gradient is read for the positions left out
# the last dim is a layer's features: only a Linear's are narrowed (its weight's rows, in the
# module and in every optimizer that holds them); narrowed by its output alone, the whole weight
# stayed in the optimizer, its unread rows' zero gradients written and updated each step
# (over_wide's trial so timed x1.54 against x6.41 bare, 2026-11-28): not the narrower layer's job
NARROW_WHY = (
    "a selection along its output's last dim (its features) is tried on a torch.nn.Linear "
    "only (its weight's rows narrowed, in the optimizer too): {0} is a {1}"
)
TIED_WHY = (
    "its {0} is also another module's ({1}): narrowing it would change that module too, "
    "which the narrower layer does not"
)


class _Selection:
    """The select fix's state on one module: its output computed over `length` positions from
    `start` along `dim` (the only ones the loss reads), the rest a broadcast of them (length 1)
    or zeros. Checked as it runs: on the first call the module's full output is computed too and
    must equal the selection's at its positions (the module computes each position from that
    position's input alone); on the first SELECT_CHECKS backwards the gradient at the positions
    left out must be zero (nobody reads them). Failing either, the module runs whole again and
    the step log says why ("# not applied")."""

    def __init__(self, torch: Any, target: str, dim: int, start: int, length: int) -> None:
        self.torch, self.target = torch, target
        self.dim, self.start, self.length = dim, start, length
        self.verified = False
        self.off: str | None = None
        self.checks = 0
        self.dims = 0  # the dims of its input and output, read on the first call
        self.at = (0, 0, 0)  # the selection's (dim, first index, the dim's size) in its output
        self.features = False  # along a Linear's output features: its weight narrowed
        self.pairs: list[tuple[Any, Any]] = []  # (its parameter, the narrower one), narrowed
        self.opts: Any = None  # the optimizers seen stepping (a WeakSet), and those swapped
        self.swapped: Any = None
        self.root: list = []  # the model, once found

    def stop(self, why: str) -> None:
        if self.off is None:
            self.off = why
            _log_line(f"# not applied: {self.target}: {why}")

    def where(self, out: Any) -> tuple[int, int] | None:
        """(dim, first index) of the selection in a tensor of `out`'s shape, or None."""
        if out.dim() == 0:
            return None
        d = self.dim % out.dim()
        size = out.shape[d]
        first = self.start % size if self.start < 0 else self.start
        if first + self.length > size or size <= self.length:
            return None
        return d, first

    def part(self, orig: Any, x: Any, d: int, first: int, out_dims: int) -> Any:
        """The module over the selection: its input's positions along the selection's dim."""
        if x.dim() != out_dims or d >= x.dim():
            raise ValueError("its input and output differ in their dims")
        return orig(x.narrow(d, first, self.length))

    def whole(self, part: Any, shape: Any, d: int, first: int) -> Any:
        """The output at its full shape: the selection broadcast (length 1, no copy) or put
        among zeros (the positions nobody reads)."""
        if self.length == 1:
            return part.expand(*shape)
        after = shape[d] - first - self.length
        pad = [0, 0] * (len(shape) - 1 - d) + [first, after]
        return self.torch.nn.functional.pad(part, pad)

    def check_grad(self, d: int, first: int) -> Any:
        def hook(grad: Any) -> None:
            self.checks += 1
            left = grad.detach().clone()
            left.narrow(d, first, self.length).zero_()
            if bool(left.any()):
                self.stop(
                    f"positions outside {self.length} from {self.start} along dim {self.dim} "
                    "get a nonzero gradient: the loss reads them, and the selection would "
                    "change the job"
                )

        return hook

    def forward(self, mod: Any, orig: Any, args: tuple, kwargs: dict) -> Any:
        torch = self.torch
        x = args[0] if len(args) == 1 and not kwargs else None
        if self.off is not None:
            return orig(*args, **kwargs)
        if not isinstance(x, torch.Tensor):
            self.stop("its forward takes other than one tensor")
            return orig(*args, **kwargs)
        if not torch.is_grad_enabled():
            self.stop("it runs without a gradient: which of its outputs are read is not seen")
            return orig(*args, **kwargs)
        if not self.verified:
            return self.verify(mod, orig, x)
        d, _, size = self.at
        if self.features:
            return self.narrowed(mod, orig, x)
        if x.dim() != self.dims:
            self.stop(f"its input's dims changed ({x.dim()}, first {self.dims})")
            return orig(x)
        size = x.shape[d]  # positions: this call's input's
        first = self.start % size if self.start < 0 else self.start
        if first + self.length > size:
            self.stop(f"an input of {size} positions along dim {d} has no such selection")
            return orig(x)
        out = self.part(orig, x, d, first, self.dims)
        shape = list(out.shape)
        shape[d] = size
        out = self.whole(out, shape, d, first)
        if self.checks < SELECT_CHECKS and out.requires_grad:
            out.register_hook(self.check_grad(d, first))
        return out

    def verify(self, mod: Any, orig: Any, x: Any) -> Any:
        """The first call: the whole output, and the selection's equal to it at its positions."""
        full = orig(x)
        at = self.where(full) if isinstance(full, self.torch.Tensor) else None
        if at is None:
            self.stop("its output has no such selection")
            return full
        if at[0] == full.dim() - 1:
            return self.verify_features(mod, x, full, at)
        try:
            with self.torch.no_grad():
                part = self.part(orig, x, *at, full.dim())
                same = part.shape == full.narrow(at[0], at[1], self.length).shape and bool(
                    self.torch.allclose(
                        part, full.narrow(at[0], at[1], self.length), rtol=1e-4, atol=1e-5
                    )
                )
        except Exception as exc:
            self.stop(f"it cannot be computed over the selection ({exc})"[:200])
            return full
        if not same:
            self.stop(
                "its output at the selected positions differs when computed over them alone: "
                "it mixes positions along that dim"
            )
            return full
        self.verified, self.dims = True, full.dim()
        self.at = (at[0], at[1], full.shape[at[0]])
        if full.requires_grad:
            full.register_hook(self.check_grad(*at))
        return full

    def verify_features(self, mod: Any, x: Any, full: Any, at: tuple[int, int]) -> Any:
        """The first call of a selection of a layer's features: a Linear (not shared), whose
        weight's rows give the selection's features."""
        torch = self.torch
        if not isinstance(mod, torch.nn.Linear):
            self.stop(NARROW_WHY.format(self.target, type(mod).__name__))
            return full
        tied = self.tied(mod)
        if tied:
            self.stop(tied)
            return full
        d, first = at
        w, b = mod.weight, mod.bias
        with torch.no_grad():
            part = torch.nn.functional.linear(
                x,
                w.narrow(0, first, self.length),
                None if b is None else b.narrow(0, first, self.length),
            )
            sel = full.narrow(d, first, self.length)
            if part.shape != sel.shape or not torch.allclose(part, sel, rtol=1e-4, atol=1e-5):
                self.stop(
                    "its output's selected features differ from its weight's rows applied to "
                    "its input: its forward is not a Linear's"
                )
                return full
        self.verified, self.dims, self.features = True, full.dim(), True
        self.at = (d, first, full.shape[d])
        if full.requires_grad:
            full.register_hook(self.check_grad(d, first))
        return full

    def tied(self, mod: Any) -> str | None:
        """Why its parameters cannot be narrowed alone: another module of the model holds one."""
        mine = {id(p): n for n, p in mod.named_parameters(recurse=False)}
        for root in self.root[:1]:
            for name, sub in root.named_modules(remove_duplicate=False):
                if sub is mod:
                    continue
                for pname, p in sub.named_parameters(recurse=False):
                    if id(p) in mine:
                        return TIED_WHY.format(mine[id(p)], f"{name}.{pname}")
        return None

    def narrowed(self, mod: Any, orig: Any, x: Any) -> Any:
        """A call once its features are verified: whole until SELECT_CHECKS backwards read a
        zero gradient outside them, then the layer narrowed to them (its output padded back)."""
        d, first, size = self.at
        if not self.pairs:
            if self.checks < SELECT_CHECKS:
                out = orig(x)
                if out.requires_grad:
                    out.register_hook(self.check_grad(d, first))
                return out
            self.narrow(mod)
        out = orig(x)  # the Linear over its narrowed weight: the selected features alone
        shape = list(out.shape)
        shape[d] = size
        return self.whole(out, shape, d, first)

    def narrow(self, mod: Any) -> None:
        """The Linear's weight and bias cut to the selected rows, in the module and in every
        optimizer that holds them (their state cut the same way)."""
        torch = self.torch
        _, first, size = self.at
        for name in ("weight", "bias"):
            old = getattr(mod, name, None)
            if old is None:
                continue
            cut = old.detach().narrow(0, first, self.length).clone()
            new = torch.nn.Parameter(cut, requires_grad=old.requires_grad)
            setattr(mod, name, new)
            self.pairs.append((old, new))
        mod.out_features = self.length
        for opt in list(self.opts or ()):
            self.swap(opt)
        _log_line(
            f"# applied: {self.target} narrowed to {self.length} of its {size} output features "
            f"(its weight's rows from {first}), in {len(self.swapped or ())} optimizer(s) too"
        )

    def on_optimizer(self, opt: Any) -> None:
        """An optimizer about to step: known, and given the narrowed parameters once they are."""
        import weakref

        if self.opts is None:
            self.opts, self.swapped = weakref.WeakSet(), weakref.WeakSet()
        self.opts.add(opt)
        if self.pairs and opt not in self.swapped:
            self.swap(opt)

    def swap(self, opt: Any) -> None:
        """The narrowed parameters in `opt`'s groups in place of the whole ones, their state
        (Adam's moments) cut to the same rows."""
        _, first, _ = self.at
        new_of = {id(old): new for old, new in self.pairs}
        for group in opt.param_groups:
            group["params"][:] = [new_of.get(id(p), p) for p in group["params"]]
        for old, new in self.pairs:
            state = opt.state.pop(old, None)
            if state is not None:
                opt.state[new] = {k: self.cut(v, old, first) for k, v in state.items()}
        self.swapped.add(opt)

    def cut(self, value: Any, old: Any, first: int) -> Any:
        """An optimizer's state of a whole parameter, cut to the narrowed rows (a tensor of
        the parameter's shape); anything else (the step count) as it is."""
        if isinstance(value, self.torch.Tensor) and value.shape == old.shape:
            return value.narrow(0, first, self.length).clone()
        return value


def select(torch: Any, values: dict) -> None:
    """The module at `target` computes only the outputs the loss reads: `length` positions
    from `start` (negative: from the end) along its output's `dim`, checked as it runs."""
    target = str(values["target"])
    sel = _Selection(
        torch,
        target,
        int(values.get("dim", 1)),
        int(values.get("start", -1)),
        int(values.get("length", 1)),
    )

    def act(sub: Any) -> None:
        orig = sub.forward

        def forward(*args, **kwargs):
            return sel.forward(sub, orig, args, kwargs)

        sub.forward = forward

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda opt, a, k: sel.on_optimizer(opt))
    _on_model(torch, target, act, sel.root)
    _say(
        f"{target} computes {sel.length} position(s) from {sel.start} along dim {sel.dim} of "
        "its output, the rest unread (checked on its first calls)"
    )


def batched(torch: Any, values: dict) -> None:
    """The module at `target` computes its calls on slices of one batch once, on the batch."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    target = str(values["target"])
    fix = _batched.Batched(torch, target, _log_line)
    register_optimizer_step_post_hook(lambda opt, a, k: fix.on_step())

    def act(sub: Any) -> None:
        orig = sub.forward

        def forward(*args, **kwargs):
            return fix.forward(sub, orig, args, kwargs)

        sub.forward = forward

    _on_model(torch, target, act)
    END.append(lambda: _log_line(fix.state()) if fix.calls else None)
    _say(
        f"{target}'s calls on slices of one batch (a loop over its samples) computed once on "
        "the batch (learnt from a step, checked on its first calls)"
    )


def _tensors(value: Any) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, torch.Tensor)]
    return []


KINDS = {
    "freeze": freeze,
    "reuse": reuse,
    "select": select,
    "batched": batched,
    "dataloader": dataloader,
    "optimizer": optimizer,
    "cudnn_benchmark": cudnn_benchmark,
    "tf32": tf32,
    "compile": compile_module,
    "checkpoint": checkpoint,
    "inference_mode": inference_mode,
    "batch": batch,
    "anomaly_off": anomaly_off,
    "padding": padding,
    "load_once": load_once,
    "thin": thin,
    "skip": skip,
    "cache": cache,
    "swap": swap,
    "settings": settings,
    "recompute_off": recompute_off,
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
        text = "".join(f"{row}\n" for row in self.rows) + "".join(f"{n}\n" for n in NOTES)
        if not text:
            return
        try:
            with _OPEN(self.path, "a") as f:
                f.write(text)
        except OSError:
            pass
        self.rows = []
        NOTES.clear()


def under_try() -> bool:
    """Whether this job was started by `gpudiag try`: GPUDIAG_TRY_STEPS names a file in a
    folder private to this user (the trial's own). A stale GPUDIAG_FIX left in the
    environment of an ordinary run skipped the job's checkpoints."""
    path = os.environ.get(STEPS_ENV)
    if not path:
        return False
    return _channel.private_path(path)


def install(torch: Any) -> None:
    """Apply GPUDIAG_FIX and start the step log, under `gpudiag try` only."""
    if not under_try():
        return
    _install_guard(torch)
    spec = os.environ.get(FIX_ENV)
    if spec:
        try:
            fix = json.loads(spec)
            values = dict(fix.get("values") or {})
            if fix.get("target"):
                values["target"] = fix["target"]
            KINDS[fix["kind"]](torch, values)
        except Exception as exc:  # never break the job's other hooks; the trial sees it
            print(f"gpudiag try: fix not applied: {exc!r}", file=sys.stderr)
            spec = None
    path = os.environ.get(STEPS_ENV)
    if path:
        if spec:
            with _OPEN(path, "a") as f:  # the trial checks the fix was applied
                f.write(f"# applied: {'; '.join(APPLIED)}\n")
        steps = _Steps(path)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        clock = _forward_clock(torch, steps)
        register_optimizer_step_post_hook(lambda opt, args, kwargs: steps.on_step())
        register_optimizer_step_post_hook(lambda opt, args, kwargs: clock.stop())
        END.append(steps.flush)
    atexit.register(_end)


def _install_guard(torch: Any) -> None:
    """Every arm: refuse a write over the job's outputs (GPUDIAG_TRY_GUARD, set by try)."""
    spec = os.environ.get(_guard.GUARD_ENV)
    if not spec:
        return
    try:
        guard = json.loads(spec)
        _guard.install(torch, float(guard["since"]), list(guard["folders"]), _log_line)
    except Exception as exc:  # never break the job; the arm runs unguarded, and says so
        print(f"gpudiag try: output guard not installed: {exc!r}", file=sys.stderr)


class _Clock:
    """The forward clock's hooks, removed at the first optimizer step."""

    def __init__(self, handles: list) -> None:
        self.handles = handles

    def stop(self) -> None:
        while self.handles:
            self.handles.pop().remove()


def _forward_clock(torch: Any, steps: _Steps) -> _Clock:
    """Time each thread's outermost forward (and its batch size) on the step file, counted
    as the serve hooks count them: a module without parameters (a torchvision transform) is
    not a model's forward, and a dict or BatchEncoding input's batch is its tensors' first
    dimension (a Hugging Face model called with a dict read 1 item a forward at any batch)."""
    import threading

    from torch.nn.modules import module as nn_module

    try:
        from . import gpudiag_serve
    except ImportError:  # loaded as a top-level module by sitecustomize
        import gpudiag_serve

    local = threading.local()

    def pre(module, args):
        depth = getattr(local, "depth", 0)
        if depth == 0 and gpudiag_serve.first_parameter(module) is None:
            return
        local.depth = depth + 1

    def post(module, args, *rest):
        # (kwargs, output); (output,) alone when the forward raised
        depth = getattr(local, "depth", 0)
        if depth == 0:  # a parameter-less module outside any model: not counted
            return
        local.depth = depth - 1
        if local.depth == 0:
            kwargs = rest[0] if len(rest) == 2 and isinstance(rest[0], dict) else {}
            items = gpudiag_serve.batch_size(tuple(args), kwargs)
            steps.on_forward(items if items > 0 else 1.0)

    return _Clock(
        [
            nn_module.register_module_forward_pre_hook(pre),
            nn_module.register_module_forward_hook(post, with_kwargs=True, always_call=True),
        ]
    )
