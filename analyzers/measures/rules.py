"""Frame rules: which breakdown category a stack sample of the training loop belongs to.

Rules are data. Each names a category and regular expressions on one frame: `function`
(searched in "dotted.module.path.function", e.g. "torch.utils.data.dataloader.
_BaseDataLoaderIter.__next__"), `file` (searched in the frame's file path) and `code`
(searched in the source line the innermost frame is executing, e.g. `loss.item()`). All the
expressions a rule gives must match. `code` is tested on the innermost frame only; the
others on any frame. The first rule, in order, that matches a stack decides its category;
user rules come before the built-in ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from gpudiag.analyzers.measures.safe_regex import check_pattern, subject
from gpudiag.probes.stacks.pyspy_output import INJECTED_FILES

_LIB_RE = re.compile(r"/lib/python\d+(\.\d+)?/|/site-packages/|/dist-packages/|^<")
# gpudiag's own code that runs inside the job (the in-process hooks) is never the user's:
# the injected modules (one list, the stack probe's) and the installed package
_OWN_RE = re.compile(
    "|".join(rf"(^|/){re.escape(name)}$" for name in INJECTED_FILES)
    + r"|/gpudiag/(probes|agent|analyzers)/"
)


@dataclass(frozen=True)
class Frame:
    """One parsed 'function (file:line)' frame."""

    function: str
    file: str
    line: int

    @property
    def dotted(self) -> str:
        """'pkg.module.function' built from the file path (best effort) and the function."""
        path = self.file
        for marker in ("/site-packages/", "/dist-packages/"):
            if marker in path:
                path = path.split(marker, 1)[1]
                break
        else:
            m = re.search(r"/lib/python\d+(\.\d+)?/", path)
            if m:
                path = path[m.end() :]
        path = path[:-3] if path.endswith(".py") else path
        path = path[:-9] if path.endswith("/__init__") else path
        return ".".join(p for p in path.strip("/").split("/") if p) + "." + self.function

    @property
    def is_own(self) -> bool:
        """True for gpudiag's own frames (the hooks' wrappers inside the job)."""
        return bool(_OWN_RE.search(self.file))

    @property
    def is_user(self) -> bool:
        """True for the job's own code (not the standard library, not installed packages)."""
        return not _LIB_RE.search(self.file) and not _OWN_RE.search(self.file)


@lru_cache(maxsize=65536)
def parse_frame(text: str) -> Frame:
    """Parse py-spy's 'function (file:line)' frame text."""
    lpar = text.rfind(" (")
    if lpar < 0 or not text.endswith(")"):
        return Frame(text, "", 0)
    inner = text[lpar + 2 : -1]
    file, _, line = inner.rpartition(":")
    if not file or not line.isdigit():
        return Frame(text[:lpar], inner, 0)
    return Frame(text[:lpar], file, int(line))


@lru_cache(maxsize=65536)
def parse_stack(stack: str) -> tuple[Frame, ...]:
    """Parse a ';'-joined, root-first stack."""
    return tuple(parse_frame(f) for f in stack.split(";") if f) if stack else ()


@dataclass(frozen=True)
class Rule:
    """Map frames matching the given expressions to a category."""

    category: str
    function: str | None = None
    file: str | None = None
    code: str | None = None
    description: str = ""
    bounded: bool = False  # a user's rule: its text cut to MAX_SUBJECT_CHARS (safe_regex)

    def __post_init__(self) -> None:
        if not (self.function or self.file or self.code):
            raise ValueError(f"rule for {self.category!r} needs function, file or code")
        for pat in (self.function, self.file, self.code):
            if pat is not None:
                re.compile(pat)

    def _text(self, text: str) -> str:
        return subject(text) if self.bounded else text

    def _frame_ok(self, fr: Frame) -> bool:
        if self.file and not re.search(self.file, self._text(fr.file)):
            return False
        return not (self.function and not re.search(self.function, self._text(fr.dotted)))

    def matches(self, frames: tuple[Frame, ...], code: str) -> bool:
        """True when this rule applies to a stack (root first) whose innermost line is `code`."""
        if not frames:
            return False
        if self.code is not None:
            return bool(re.search(self.code, self._text(code))) and self._frame_ok(frames[-1])
        return any(self._frame_ok(fr) for fr in frames)


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule(
        "startup",
        file=r"^<frozen importlib\._bootstrap",
        description="importing modules: start-up, left out of the loop's breakdown",
    ),
    Rule(
        "startup",
        file=r"torch/_dynamo/convert_frame\.py$|torch/_inductor/(compile_fx|codecache|"
        r"async_compile|graph)\.py$|torch/_functorch/_aot_autograd/"
        r"(jit_compile_runtime_wrappers|collect_metadata_analysis)\.py$",
        description="torch.compile compiling (Dynamo converting a frame, AOTAutograd tracing, "
        "Inductor's code generation): start-up, though it runs under the model's call",
    ),
    Rule(
        "checkpoint",
        function=r"torch\.serialization\.(save|_save)$",
        description="torch.save writing a checkpoint",
    ),
    Rule(
        "checkpoint",
        function=r"(^|\.)(_?save_checkpoint|_atomic_save)$",
        description="a checkpoint save callback (Lightning, Hugging Face Trainer) and the "
        "file write after serialisation (Lightning's _atomic_save: torch.save into memory, "
        "then the write through fsspec)",
    ),
    Rule(
        "checkpoint",
        function=r"safetensors\..*\.save(_file|_model)?$",
        description="safetensors saving",
    ),
    Rule(
        "checkpoint",
        function=r"torch\.distributed\.checkpoint\..*save",
        description="torch.distributed.checkpoint save",
    ),
    Rule(
        "collective",
        file=r"torch/distributed/(distributed_c10d|_functional_collectives|"
        r"fsdp/|algorithms/)",
        description="torch.distributed collectives (all_reduce, reduce_scatter, all_gather, "
        "barrier, broadcast; FSDP)",
    ),
    Rule(
        "collective",
        function=r"torch\.nn\.parallel\.distributed\.(DistributedDataParallel\.)?"
        r"(_sync_buffers|_sync_module_buffers|_sync_params_and_buffers|"
        r"_distributed_broadcast_coalesced|_default_broadcast_coalesced|"
        r"_check_global_requires_backward_grad_sync|_match_all_reduce_for_bwd_pass)$",
        description="DDP's own collectives in forward (buffer broadcasts, join); its gradient "
        "all-reduce runs in C++ under backward and is not visible in Python stacks",
    ),
    Rule(
        "data_wait",
        file=r"torch/utils/data/dataloader\.py$",
        description="iterating a DataLoader: waiting for (with num_workers=0: making) a batch",
    ),
    Rule(
        "sync",
        function=r"torch\.cuda\.(synchronize|Event\.synchronize|Stream\.synchronize)",
        description="torch.cuda.synchronize",
    ),
    Rule(
        "sync",
        code=r"\.(item|cpu|tolist|numpy)\(\s*\)|\.nonzero\(|torch\.cuda\.synchronize",
        description="host-device sync on the executing line: .item(), .cpu(), .tolist()",
    ),
    Rule(
        "h2d_copy",
        code=r"\.(cuda|to)\(.*(cuda|device|non_blocking)|\.cuda\(\s*\)|\.pin_memory\(",
        description="host-to-device copy on the executing line: .to(device), .cuda()",
    ),
    Rule("optimizer", file=r"torch/optim/", description="optimizer step and zero_grad"),
    Rule(
        "backward",
        function=r"torch\._tensor\.Tensor\.backward$|torch\.autograd\.",
        description="autograd backward",
    ),
    Rule(
        "forward",
        file=r"torch/nn/modules/module\.py$",
        description="calling an nn.Module (forward)",
    ),
)

# A job that never trains: autograd's grad-mode switches (entering no_grad or inference_mode)
# are not a backward. Put before the built-in rules for such jobs only (the training
# recordings' breakdowns stay as they were).
NO_TRAINING_RULES: tuple[Rule, ...] = (
    Rule(
        "other",
        function=r"torch\.autograd\.grad_mode\.",
        description="entering or leaving no_grad/inference_mode (a job with no backward)",
    ),
)

# Frames that mark a DataLoader worker's loading work (other worker threads only wait or serve).
WORKER_LOOP_RE = re.compile(r"torch/utils/data/_utils/worker\.py")

# Loader stacks (DataLoader workers, or the loop thread making batches itself) in storage reads.
IO_RULES: tuple[Rule, ...] = (
    Rule(
        "io",
        code=r"\b(open|read|readinto|readline|readlines|pread|fromfile|memmap|imread)"
        r"\s*\(|np\.load\(|numpy\.load\(|torch\.load\(|Image\.open\(",
        description="reading from storage on the executing line",
    ),
    Rule(
        "io",
        function=r"(numpy\.lib\.(npyio|format)\.|PIL\.Image\.open|"
        r"torch\.serialization\.load|h5py\.|lmdb|_io\.)",
        description="library file readers (numpy, PIL, torch.load, h5py, lmdb)",
    ),
)

# Innermost frames that mean a thread waits for work (queues, locks, select).
WAIT_RULES: tuple[Rule, ...] = (
    Rule(
        "wait",
        # asyncio's runner innermost: an event loop running in C (uvloop), in its epoll wait
        file=r"(multiprocessing/(queues|connection|synchronize|resource_sharer)\.py|"
        r"/queue\.py|/threading\.py|/selectors\.py|/socket\.py|/asyncio/runners\.py)$",
        description="waiting on a queue, lock, condition, select or a C event loop",
    ),
)


# The executing line of a loader that waits rather than computes: a sleep, a socket or HTTP
# read, an object-store request, a select/poll (the loop thread loading with num_workers=0,
# whose schedstat alone cannot tell waiting from the native threads it waits on).
BLOCKING_CALL_RULES: tuple[Rule, ...] = (
    Rule(
        "blocking",
        code=r"\bsleep\(|\.recv(_into|from)?\(|urlopen\(|requests\.(get|post|request)\(|"
        r"\.(get_object|download_file|download_fileobj|read_object)\(|\b(select|poll)\(",
        description="a sleep, socket/HTTP read, object-store request or select on the line",
    ),
) + WAIT_RULES


# Loading a model or its weights: Hugging Face's from_pretrained (models, tokenizers,
# processors), from_config (a model built from its config, its weights initialised: Hugging
# Face, diffusers) and pipeline(), sentence-transformers' constructor, torch.jit.load, a state
# dict put in (building the modules runs their __init__ under torch/nn/modules: not a
# forward); and the weights' readers, torch.load and safetensors, which read data as often as
# models
LOAD_FUNCS = frozenset(
    {"from_pretrained", "_load_pretrained_model", "from_config", "_from_config", "load_state_dict"}
)
LOAD_IN_FILE = (
    (re.compile(r"/transformers/pipelines/__init__\.py$"), frozenset({"pipeline"})),
    (re.compile(r"/sentence_transformers/SentenceTransformer\.py$"), frozenset({"__init__"})),
    (re.compile(r"/torch/jit/_serialization\.py$"), frozenset({"load"})),
)
WEIGHTS_IN_FILE = (
    (re.compile(r"/torch/serialization\.py$"), frozenset({"load"})),
    (re.compile(r"/safetensors/"), frozenset({"load_file", "load", "safe_open"})),
)


def is_model_loading(frames: tuple, readers: bool = True) -> bool:
    """Whether a stack is loading a model or its weights (`readers`: torch.load and
    safetensors alone count, as on a request path; a loop's may be reading its data)."""
    in_file = LOAD_IN_FILE + WEIGHTS_IN_FILE if readers else LOAD_IN_FILE
    for fr in frames:
        name = fr.function.rsplit(".", 1)[-1]
        if name in LOAD_FUNCS:
            return True
        if any(rx.search(fr.file) and name in names for rx, names in in_file):
            return True
    return False


def _first(rules: tuple[Rule, ...], stack: str, code: str, innermost_only: bool) -> str | None:
    frames = parse_stack(stack)
    if innermost_only:
        frames = frames[-1:]
    for rule in rules:
        if rule.matches(frames, code):
            return rule.category
    return None


_BACKWARD_CALL = re.compile(r"torch\._tensor\.Tensor\.backward$|torch\.autograd\.backward$")
_MODULE_FILE = re.compile(r"torch/nn/modules/module\.py$")
_OPTIM_FILE = re.compile(r"torch/optim/")


def _closure_phase(stack: str) -> str | None:
    """forward/backward when an optimizer step calls back into the model (LBFGS's closure):
    that time is the model's, not the optimizer's update."""
    frames = parse_stack(stack)
    last_optim = max(
        (i for i, fr in enumerate(frames) if _OPTIM_FILE.search(fr.file)), default=None
    )
    if last_optim is None:
        return None
    inner = frames[last_optim + 1 :]
    if any(_BACKWARD_CALL.search(fr.dotted) for fr in inner):
        return "backward"
    if any(_MODULE_FILE.search(fr.file) for fr in inner):
        return "forward"
    return None


def _builtin_refined(cat: str, stack: str) -> str:
    """A built-in category refined by the whole stack: an optimizer step's closure is the
    model's time; loading a model (its modules built under torch/nn/modules, its weights put
    in) is start-up wherever it runs (profile_loop puts the loop's own loading back)."""
    if cat == "optimizer":
        return _closure_phase(stack) or cat
    return "startup" if is_model_loading(parse_stack(stack), readers=False) else cat


class Classifier:
    """Classifies stacks with user rules first, then the defaults; results are cached."""

    def __init__(self, user_rules: tuple[Rule, ...] = ()) -> None:
        self.user_rules = tuple(user_rules)
        self.rules = self.user_rules + DEFAULT_RULES
        self._cache: dict[tuple[str, str], str] = {}

    def category(self, stack: str, code: str = "") -> str:
        """The breakdown category of a loop-thread stack ('other' when no rule matches)."""
        key = (stack, code)
        cat = self._cache.get(key)
        if cat is None:
            cat = _first(self.rules, stack, code, False) or "other"
            if cat in ("optimizer", "forward", "other") and not _first(
                self.user_rules, stack, code, False
            ):
                cat = _builtin_refined(cat, stack)
            if len(self._cache) < 200000:
                self._cache[key] = cat
        return cat

    @staticmethod
    def is_io(stack: str, code: str = "") -> bool:
        """True when a loader stack is reading from storage."""
        return _first(IO_RULES, stack, code, False) is not None

    @staticmethod
    def is_blocking_call(stack: str, code: str = "") -> bool:
        """True when a loader stack's executing line waits (sleep, socket, object store)."""
        return _first(BLOCKING_CALL_RULES, stack, code, True) is not None

    @staticmethod
    def is_waiting(stack: str, code: str = "") -> bool:
        """True when a stack's innermost frame waits on a queue, lock or select."""
        return _first(WAIT_RULES, stack, code, True) is not None


def user_location(stack: str) -> Frame | None:
    """The innermost frame of the job's own code in a stack."""
    for fr in reversed(parse_stack(stack)):
        if fr.is_user and fr.file and fr.line > 0:
            return fr
    return None


def rules_from_config(entries: list[dict]) -> tuple[Rule, ...]:
    """Build user rules from config entries; raises ValueError with a readable message."""
    from gpudiag.analyzers.model.results import CATEGORIES

    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"rule {i + 1}: expected a table with category and a pattern")
        unknown = set(e) - {"category", "function", "file", "code", "description"}
        if unknown:
            raise ValueError(f"rule {i + 1}: unknown keys {sorted(unknown)}")
        cat = e.get("category")
        if cat not in CATEGORIES:
            raise ValueError(f"rule {i + 1}: category must be one of {', '.join(CATEGORIES)}")
        try:
            pats = {k: check_pattern(e[k], k) for k in ("function", "file", "code") if k in e}
            desc = e.get("description", "user rule")
            if not isinstance(desc, str):
                raise ValueError("description must be a string")
            out.append(Rule(cat, description=desc, bounded=True, **pats))
        except ValueError as exc:
            raise ValueError(f"rule {i + 1}: {exc}") from None
    return tuple(out)
