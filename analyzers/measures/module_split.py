"""Where a training step's compute goes when no hook timed the modules (plain `attach`, a
recording without the in-process hooks): the loop thread's py-spy samples in the model,
attributed to module call sites from the stacks' module frames.

torch's `Module._wrapped_call_impl` / `Module._call_impl` frames (torch/nn/modules/module.py)
mark each module call. A forward sample's innermost call is the leaf module it runs in: the
frame just before it is the parent's line that called it (`GPT.forward model.py:88`), the
frame after it the called module's `forward` (`Linear.forward`, whose class py-spy's qualified
name gives). Samples are grouped by that call site, so identical layers of every block add up
at their code line. A sample whose innermost call is the model itself (called by the loop) is
the model's own code, at its line. The backward and the optimizer step are rows of their own,
at the job's line that called them. Shares are of the loop's stack samples: CPU time of the
loop thread (on a GPU job, the time it takes to launch the work, not the GPU's time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudiag.analyzers.measures.loop import LoopProfile
from gpudiag.analyzers.measures.rules import Classifier, Frame, parse_stack
from gpudiag.analyzers.model.results import Location
from gpudiag.analyzers.timeline.timeline import Aggregate

MODEL_PHASES = ("forward", "backward", "optimizer")
MAX_ROWS = 30  # rows kept, largest first
_MODULE_FILE = re.compile(r"torch/nn/modules/module\.py$")
_COMMENT = re.compile(r"\s+#[^'\"]*$")
_CONTAINER_FILE = re.compile(r"torch/nn/modules/container\.py$")
_CALL_FUNCS = frozenset({"_call_impl", "_wrapped_call_impl"})
_OPTIM_FILE = re.compile(r"torch/optim/")
_BACKWARD = re.compile(r"torch\._tensor\.Tensor\.backward$|torch\.autograd\.backward$")
# wrappers whose forward only hands the call on to the model (their own time is the model's)
_WRAPPERS = frozenset(
    {"DistributedDataParallel", "DataParallel", "OptimizedModule", "FullyShardedDataParallel"}
)


@dataclass(frozen=True)
class SplitRow:
    """One place of the model's time: a module called at a site, the model's own code at a
    line, the backward or the optimizer step at the job's line that ran it."""

    kind: str  # call, own, backward, optimizer
    site: Location | None  # the calling line (call, backward, optimizer) or the own line
    module: str  # the called module's class ("Linear"), the optimizer's step, or ""
    callee: Location | None  # the called module's forward frame (call, own)
    samples: float
    share: float  # of the loop's stack samples
    code: str = ""  # the most sampled executing line of the job's own code in it
    call: str = ""  # the text of the calling line (a call row's site), when the probe read it

    def to_dict(self) -> dict:
        d = self.fields()
        return {**d, "label": row_label(d)}

    def fields(self) -> dict:
        return {
            "kind": self.kind,
            "share": round(self.share, 4),
            "samples": round(self.samples, 1),
            "module": self.module,
            "site": _loc(self.site),
            "callee": _loc(self.callee),
            "code": self.code,
            "call": self.call,
        }


def row_label(row: dict) -> str:
    """A row of the report's compute_stacks in words: 'Linear called at model.py:88
    (GPT.forward)', 'the model's own code (GPT) at model.py:85 (GPT.forward)'."""
    site = row.get("site") or {}
    at = (
        f"{str(site['file']).rsplit('/', 1)[-1]}:{site['line']} ({site['function']})"
        if site.get("file")
        else "an unknown line"
    )
    module = row.get("module") or ""
    kind = row.get("kind")
    if kind == "call":
        call = _COMMENT.sub("", row.get("call") or "")  # its trailing comment left out
        if call:
            return f"`{call}` ({module or 'a module'}) at {at}"
        return f"{module or 'a module'} called at {at}"
    if kind == "own":
        return f"the model's own code ({module or 'its forward'}) at {at}"
    if kind == "backward":
        return f"the backward called at {at}"
    return f"the optimizer ({module or 'its step'}) called at {at}"


def _loc(loc: Location | None) -> dict | None:
    return None if loc is None else {"file": loc.file, "line": loc.line, "function": loc.function}


@dataclass(frozen=True)
class ComputeSplit:
    """The model's time by call site, from the loop thread's stack samples."""

    rows: tuple[SplitRow, ...]
    loop_samples: float
    on_gpu: bool  # the job uses a GPU: the shares are launch time, not GPU time

    @property
    def model_share(self) -> float:
        return sum(r.share for r in self.rows)

    @property
    def time(self) -> str:
        return "launch" if self.on_gpu else "cpu"

    def note(self) -> str:
        """What the shares are, in words (the report's, the renderers')."""
        what = (
            "the loop thread's CPU time launching the GPU's work (not the GPU's time)"
            if self.on_gpu
            else "the loop thread's CPU time"
        )
        return (
            f"estimated from {self.loop_samples:.0f} py-spy stack samples of the loop: a share "
            f"is {what}; a module's row is its call site (every block's layer at one line); "
            "its work is not read: `gpudiag attach --hooks PID` or `gpudiag run` times each "
            "module and counts its FLOPs and bytes"
        )

    def to_dict(self) -> dict:
        return {
            "source": "stacks",
            "time": self.time,
            "loop_samples": round(self.loop_samples, 1),
            "model_share": round(self.model_share, 4),
            "note": self.note(),
            "rows": [r.to_dict() for r in self.rows],
        }


def _is_call(fr: Frame) -> bool:
    return fr.function.rsplit(".", 1)[-1] in _CALL_FUNCS and bool(_MODULE_FILE.search(fr.file))


def class_of(fr: Frame) -> str:
    """The class of a method's frame from py-spy's qualified name ("Linear.forward" ->
    "Linear", "make.<locals>.Net.forward" -> "Net"), "" for a plain function."""
    parts = fr.function.split(".")
    return parts[-2] if len(parts) >= 2 and parts[-2] != "<locals>" else ""


def module_calls(frames: tuple[Frame, ...]) -> list[tuple[int, int]]:
    """(caller index, callee index) of each module call in a root-first stack, outermost
    first; a wrapper's call (DDP, DataParallel, torch.compile's module) is left out."""
    out = []
    i = 0
    while i < len(frames):
        if not _is_call(frames[i]):
            i += 1
            continue
        j = i
        while j < len(frames) and _is_call(frames[j]):
            j += 1
        if i > 0 and j < len(frames) and class_of(frames[j]) not in _WRAPPERS:
            out.append((i - 1, j))
        i = j
    return out


def _loc_of(fr: Frame) -> Location:
    return Location(fr.file, fr.line, fr.function)


def _caller_of(frames: tuple[Frame, ...], first: int) -> Location | None:
    """The job's frame that made a call at index `first` (the innermost of the job's own
    frames above it, else the frame just above it)."""
    above = frames[:first]
    user = [fr for fr in above if fr.is_user]
    if user:
        return _loc_of(user[-1])
    return _loc_of(above[-1]) if above else None


def _model_key(frames: tuple[Frame, ...]) -> tuple[str, Location | None, str, Location | None]:
    """A forward sample's (kind, site, module, callee)."""
    calls = module_calls(frames)
    if not calls:
        inner = next((fr for fr in reversed(frames) if fr.is_user), frames[-1])
        return "own", _loc_of(inner), "", None
    caller, callee = calls[-1]
    module = class_of(frames[callee]) or frames[callee].function
    if len(calls) > 1:
        # a layer a container called (Sequential, ModuleList's forward): named at the line
        # that called the container, "Linear in Sequential"
        k = len(calls) - 1
        while k > 0 and _CONTAINER_FILE.search(frames[calls[k][0]].file):
            module += f" in {class_of(frames[calls[k - 1][1]]) or 'a container'}"
            k -= 1
        return "call", _loc_of(frames[calls[k][0]]), module, _loc_of(frames[callee])
    # the model itself, called by the loop: its own code, at its innermost line of the job's
    inner = next((fr for fr in reversed(frames[callee:]) if fr.is_user), frames[callee])
    return "own", _loc_of(inner), module, _loc_of(frames[callee])


def _phase_key(frames: tuple[Frame, ...], phase: str) -> tuple[str, Location | None, str]:
    """A backward or optimizer sample's (kind, site, module)."""
    if phase == "backward":
        first = next((i for i, fr in enumerate(frames) if _BACKWARD.search(fr.dotted)), None)
        module = ""
    else:
        first = next((i for i, fr in enumerate(frames) if _OPTIM_FILE.search(fr.file)), None)
        step = next(
            (
                fr
                for fr in frames[first or 0 :]
                if _OPTIM_FILE.search(fr.file) and fr.function.endswith((".step", ".zero_grad"))
            ),
            None,
        )
        module = step.function if step is not None else ""
    if first is None:
        inner = next((fr for fr in reversed(frames) if fr.is_user), None)
        return phase, None if inner is None else _loc_of(inner), module
    return phase, _caller_of(frames, first), module


def _call_text(key: tuple, sources: dict[tuple[str, int], str]) -> str:
    site = key[1]
    if key[0] != "call" or site is None:
        return ""
    return sources.get((site.file, site.line), "")


def _most(counts: dict[str, float]) -> str:
    return max(counts, key=lambda c: (counts[c], c)) if counts else ""


def call_sources(view: Aggregate) -> dict[tuple[str, int], str]:
    """(file, line) -> the text of a line the stack probe saw calling a torch module."""
    out = {}
    for lab, _r in view.matching("stacks", "seen", kind="source"):
        line = lab.get("line", "")
        if line.isdigit() and lab.get("code"):
            out[(lab.get("file", ""), int(line))] = lab["code"]
    return out


def compute_split(
    view: Aggregate,
    profile: LoopProfile,
    clf: Classifier,
    on_gpu: bool = False,
    sources: dict[tuple[str, int], str] | None = None,
) -> ComputeSplit | None:
    """The loop's forward, backward and optimizer samples by call site; None without any.
    `sources`: the calling lines' text (call_sources, read over the whole run)."""
    n = profile.samples
    if n <= 0 or profile.thread is None:
        return None
    # (kind, site, module, callee) -> [samples, {code: samples}, {optimizer step: samples}]
    rows: dict[tuple, list] = {}
    for (stack, code), count in view.stacks.get(profile.thread, {}).items():
        phase = profile.placed(clf, stack, code)
        if phase not in MODEL_PHASES:
            continue
        frames = tuple(fr for fr in parse_stack(stack) if fr.file and fr.line > 0 and not fr.is_own)
        if not frames:
            continue
        step = ""
        if phase == "forward":
            key: tuple = _model_key(frames)
        else:  # one row per line that ran it, named by the step most of its samples are in
            kind, site, step = _phase_key(frames, phase)
            key = (kind, site, "", None)
        entry = rows.setdefault(key, [0.0, {}, {}])
        entry[0] += count
        if code and frames[-1].is_user:
            entry[1][code] = entry[1].get(code, 0.0) + count
        if step:
            entry[2][step] = entry[2].get(step, 0.0) + count
    if not rows:
        return None
    out = sorted(
        (
            SplitRow(
                k[0],
                k[1],
                k[2] or _most(v[2]),
                k[3],
                v[0],
                v[0] / n,
                _most(v[1]),
                _call_text(k, sources or {}),
            )
            for k, v in rows.items()
        ),
        key=lambda r: (-r.samples, row_label(r.fields())),
    )
    return ComputeSplit(tuple(out[:MAX_ROWS]), n, on_gpu)


# frames a trial cannot patch by name: a comprehension's, a lambda's, a module's body
_UNNAMED = re.compile(r"<(listcomp|dictcomp|setcomp|genexpr|lambda|module)>")


@dataclass(frozen=True)
class OwnCall:
    """The job's own function where most of the model's own code's forward samples are: called
    from the model's forward, below it (a helper the forward calls, not the forward itself)."""

    file: str
    function: str  # its qualified name as py-spy reads it ("positional_table", "Net.build")
    share: float  # of the forward's own-code samples

    @property
    def target(self) -> str:
        """MODULE.FUNCTION as `gpudiag try` takes it (MODULE: the file's stem)."""
        stem = self.file.rsplit("/", 1)[-1].removesuffix(".py")
        return f"{stem}.{self.function}"


def own_call(view: Aggregate, profile: LoopProfile, clf: Classifier) -> OwnCall | None:
    """The innermost named function of the job's own, below the model's forward frame, that
    holds most (`OWN_CALL_SHARE`) of the forward samples in the model's own code; None."""
    if profile.thread is None:
        return None
    counts: dict[tuple[str, str], float] = {}
    total = 0.0
    for (stack, code), count in view.stacks.get(profile.thread, {}).items():
        if profile.placed(clf, stack, code) != "forward":
            continue
        frames = tuple(fr for fr in parse_stack(stack) if fr.file and fr.line > 0 and not fr.is_own)
        calls = module_calls(frames)
        if len(calls) != 1:  # a layer's time, or the model's own code of no module
            continue
        total += count
        start = calls[0][1]  # the model's forward (past torch's call frames: a hook's `inner`)
        while start < len(frames) - 1 and _MODULE_FILE.search(frames[start].file):
            start += 1
        below = [fr for fr in frames[start + 1 :] if fr.is_user]
        named = [fr for fr in below if not _UNNAMED.search(fr.function)]
        if named:
            key = (named[-1].file, named[-1].function)
            counts[key] = counts.get(key, 0.0) + count
    if not counts or total <= 0:
        return None
    (file, function), n = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    return OwnCall(file, function, n / total) if n / total >= OWN_CALL_SHARE else None


OWN_CALL_SHARE = 0.5
