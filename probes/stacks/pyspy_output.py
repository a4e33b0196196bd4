"""py-spy's output parsed: collapsed stacks (raw format), speedscope profiles with the runs
of samples inside one library call (episodes), and the source lines frames point at."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpudiag.probes.inject as inject
from gpudiag.probes.files import Reader, read_regular, reader_of

_PROCESS_RE = re.compile(r'^process (\d+):"(.*?)"$')
_PROFILE_RE = re.compile(r'^(?:Process (\d+) )?Thread (0x[0-9a-fA-F]+|\d+)(?: "(.*)")?')
# gpudiag's own modules injected into the job (its DataLoader and tensor wrappers): their
# frames are gpudiag's, never the user's, so they are dropped from every stack
OWN_FILES = (
    "gpudiag_hooks.py",
    "gpudiag_dist.py",
    "gpudiag_capture.py",
    "gpudiag_trim.py",
    "gpudiag_serve.py",
    "gpudiag_padding.py",
    "gpudiag_compute.py",  # the compute sampler's hooks and its op-counting dispatch mode
    "gpudiag_callsite.py",  # try's thin:/skip: wrappers around a call site
    "gpudiag_batched.py",  # try's batched: a module's per-sample calls served from one
    "gpudiag_fixes.py",  # try's fixes applied inside the job
)
# every module gpudiag injects (its own threads too: the channel, the attach loader): never
# the job's own code, though only OWN_FILES' frames are dropped from a stack
INJECTED_FILES = tuple(sorted(p.name for p in Path(inject.__file__).parent.glob("gpudiag_*.py")))
_LIB_RE = re.compile(r"/lib/python\d+(\.\d+)?/|/site-packages/|/dist-packages/|^<")
_THREAD_RE = re.compile(r"^thread \((0x[0-9a-fA-F]+|\d+)\)(?::\s*(.*))?$")
# a stack label joins its frames with ';' (as py-spy's collapsed format does): a ';' inside a
# frame's function or file name (the job chooses both: `code.replace(co_name=...)`) is shown as
# a full-width '；', so it never splits one frame into forged ones; control characters go too
SEP_STAND_IN = "\uff1b"
_NAME_CLEAN = {**{c: " " for c in range(32)}, 0x7F: " ", ord(";"): SEP_STAND_IN}
# the end of one frame in py-spy's raw output: 'func (file:line)' or 'func (file)'
_RAW_FRAME_END = re.compile(r" \(.*\)$")


def frame_name(name: object, loc: object) -> str:
    """One frame as stack labels hold it, 'func (file:line)', with no ';' inside."""
    return f"{str(name).translate(_NAME_CLEAN)} ({str(loc).translate(_NAME_CLEAN)})"


def raw_frames(parts: list[str]) -> tuple[str, ...]:
    """The frames of one raw line split at ';': a piece that does not end a frame (a ';' in
    a function name) is joined to the piece after it, not taken as a frame of its own."""
    frames: list[str] = []
    piece: list[str] = []
    for part in parts:
        piece.append(part)
        if _RAW_FRAME_END.search(part):
            frames.append(SEP_STAND_IN.join(piece).translate(_NAME_CLEAN))
            piece = []
    if piece:
        frames.append(SEP_STAND_IN.join(piece).translate(_NAME_CLEAN))
    return tuple(frames)


@dataclass(frozen=True)
class StackRow:
    """One collapsed stack from py-spy: which process and thread, root-to-leaf frames, count."""

    pid: int
    tid: int
    thread: str
    frames: tuple[str, ...]
    count: int


def parse_raw(lines: Iterable[str], default_pid: int) -> list[StackRow]:
    """Parse py-spy's raw (collapsed) output, with or without process and thread frames."""
    rows: list[StackRow] = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        head, _, count_s = line.rpartition(" ")
        try:
            count = int(count_s)
        except ValueError:
            continue
        pid, tid, thread = default_pid, 0, ""
        parts = head.split(";")
        i = 0
        if parts and (m := _PROCESS_RE.match(parts[0])):
            pid = int(m.group(1))
            i = 1
        if i < len(parts) and (m := _THREAD_RE.match(parts[i])):
            tid = int(m.group(1), 0)
            thread = (m.group(2) or "").strip()
            i += 1
        rows.append(StackRow(pid, tid, thread, drop_own_frames(raw_frames(parts[i:])), count))
    return rows


def is_own_frame(frame: str) -> bool:
    """True for a 'func (file:line)' frame in one of gpudiag's injected modules."""
    lpar = frame.rfind(" (")
    path = frame[lpar + 2 :].rsplit(":", 1)[0] if lpar >= 0 else ""
    return path.rsplit("/", 1)[-1] in OWN_FILES


def drop_own_frames(frames: Any) -> tuple[str, ...]:
    """The frames without gpudiag's own (its wrapper between the user's loop and torch)."""
    return tuple(f for f in frames if not is_own_frame(f))


def is_library_frame(frame: str) -> bool:
    """True when a 'func (file:line)' frame is in the standard library or an installed package."""
    lpar = frame.rfind(" (")
    path = frame[lpar + 2 :] if lpar >= 0 else frame
    return bool(_LIB_RE.search(path))


# the outermost frame of a checkpoint save: a save callback (Lightning, Hugging Face Trainer),
# Lightning's _atomic_save (torch.save into memory, then the fsspec file write), torch.save
SAVE_FRAME_RE = re.compile(
    r"^(\w+\.)*(_?save_checkpoint|_atomic_save) \(|^save \(.*torch/serialization\.py:"
)


# an evaluation pass inside a training loop: a function of the job's own code named like
# evaluation (evaluate, eval_step, run_validation, val_epoch...; not train_and_evaluate),
# or a trainer's evaluation
# loop (Hugging Face's Trainer.evaluate/evaluation_loop, Lightning's loops/evaluation_loop.py)
EVAL_NAME_RE = re.compile(r"(^|_)(eval|evaluate|evaluation|validate|validation)(_|$)|^val(_|$)")
_EVAL_LIB_RE = re.compile(
    r"^(\w+\.)*(evaluate|evaluation_loop|prediction_loop) \(.*/transformers/trainer\.py:|"
    r"\(.*/(lightning/pytorch|pytorch_lightning)/loops/evaluation_loop\.py:"
)


def is_eval_frame(frame: str) -> bool:
    """True for a 'func (file:line)' frame that runs an evaluation pass (see EVAL_NAME_RE)."""
    if _EVAL_LIB_RE.search(frame):
        return True
    if is_library_frame(frame) or is_own_frame(frame):
        return False
    lpar = frame.rfind(" (")
    name = (frame[:lpar] if lpar >= 0 else frame).rsplit(".", 1)[-1]
    # train_and_evaluate, train_eval: the training loop itself, not an evaluation inside it
    return "train" not in name.lower() and bool(EVAL_NAME_RE.search(name))


# torch's decorator frame around a function decorated with @torch.no_grad() or
# @torch.inference_mode() (nanoGPT's estimate_loss, a Trainer's eval step): in a job that
# trains, such a function is an evaluation (or sampling) pass, whatever its name
_NO_GRAD_RE = re.compile(r"decorate_context \(.*torch/utils/_contextlib\.py:")


def _under_no_grad(frames: tuple[str, ...], i: int) -> bool:
    """True when frame i is the job's own function called through torch's no-grad decorator."""
    return (
        i > 0
        and bool(_NO_GRAD_RE.search(frames[i - 1]))
        and not is_library_frame(frames[i])
        and not is_own_frame(frames[i])
    )


def eval_frame_index(frames: tuple[str, ...]) -> int | None:
    """The index of the outermost evaluation frame of a stack (root first), None: none: a
    function named like evaluation, or the job's own function decorated with no_grad."""
    return next(
        (
            i
            for i, f in enumerate(frames)
            if i > 0 and (is_eval_frame(f) or _under_no_grad(frames, i))
        ),
        None,
    )


def _entry(frames: tuple[str, ...], i: int) -> str:
    """The anchor of frames[:i+1]: frame i without its line (one call, wherever it runs)."""
    frame = frames[i]
    lpar = frame.rfind(" (")
    colon = frame.rfind(":")
    entry = frame[:colon] + ")" if lpar >= 0 and colon > lpar else frame
    return ";".join(frames[:i] + (entry,))


def episode_anchor(frames: tuple[str, ...]) -> str | None:
    """The user-code call into a library that a stack is inside, without the library's line.

    Consecutive samples with the same anchor are one episode of that call (one torch.save,
    one fetch of a batch): counting episodes tells how often a call runs and how long each takes.
    """
    for i, frame in enumerate(frames):
        # a checkpoint save anchors its own episode even deep inside a library (Lightning's
        # Trainer.fit): one save, serialisation and the file write after it, is one episode
        if i > 0 and SAVE_FRAME_RE.match(frame):
            return _entry(frames, i)
    # an evaluation pass is one episode whatever it calls (forwards, its DataLoader)
    ev = eval_frame_index(frames)
    if ev is not None:
        return _entry(frames, ev)
    for i, frame in enumerate(frames):
        if i > 0 and is_library_frame(frame) and not is_library_frame(frames[i - 1]):
            return _entry(frames, i)
    return None


@dataclass(frozen=True)
class Episode:
    """Runs of consecutive samples of one thread inside one library call (see episode_anchor)."""

    pid: int
    tid: int
    thread: str
    anchor: str
    episodes: int
    count: int


def parse_speedscope(doc: dict, default_pid: int) -> tuple[list[StackRow], list[Episode]]:
    """Parse py-spy's speedscope output into stack counts and call episodes per thread."""
    frames_tbl = doc.get("shared", {}).get("frames", [])
    names = []
    for fr in frames_tbl:
        line = fr.get("line")
        loc = f"{fr.get('file', '?')}:{line}" if line is not None else str(fr.get("file", "?"))
        names.append(frame_name(fr.get("name", "?"), loc))
    rows: list[StackRow] = []
    episodes: list[Episode] = []
    for prof in doc.get("profiles", []):
        m = _PROFILE_RE.match(prof.get("name", ""))
        pid = int(m.group(1)) if m and m.group(1) else default_pid
        tid = int(m.group(2), 0) if m else 0
        thread = (m.group(3) or "") if m else ""
        counts: dict[tuple[str, ...], int] = {}
        ep_runs: dict[str, list[int]] = {}
        prev_anchor: str | None = None
        for idx in prof.get("samples", []):
            # speedscope lists frames root first
            stack = drop_own_frames(names[i] for i in idx if 0 <= i < len(names))
            counts[stack] = counts.get(stack, 0) + 1
            if pid != default_pid:
                continue
            anchor = episode_anchor(stack)
            if anchor is not None:
                runs = ep_runs.setdefault(anchor, [0, 0])
                runs[1] += 1
                if anchor != prev_anchor:
                    runs[0] += 1
            prev_anchor = anchor
        rows.extend(StackRow(pid, tid, thread, st, c) for st, c in counts.items())
        episodes.extend(Episode(pid, tid, thread, a, r[0], r[1]) for a, r in ep_runs.items())
    return rows, episodes


MAX_SOURCE_BYTES = 4 << 20  # a source file a frame names: larger is not read


class SourceLines:
    """Reads the source line a frame points at (through /proc/PID/root for containers), by
    the one bounded reader: a regular file of at most MAX_SOURCE_BYTES that the job's own
    user could read (a frame naming /dev/zero, a FIFO or a root-only file gives '')."""

    def __init__(self, max_entries: int = 20000, max_files: int = 64) -> None:
        self._cache: dict[tuple[str, int], str] = {}
        self._files: dict[str, list[str] | None] = {}
        self._readers: dict[int, Reader | None] = {}
        self.max_entries = max_entries
        self.max_files = max_files

    def line(self, pid: int, frame: str) -> str:
        """The stripped source text of a 'func (file:line)' frame, '' when unknown."""
        lpar = frame.rfind(" (")
        colon = frame.rfind(":")
        if lpar < 0 or colon < lpar:
            return ""
        path = frame[lpar + 2 : colon]
        try:
            lineno = int(frame[colon + 1 :].rstrip(")"))
        except ValueError:
            return ""
        key = (path, lineno)
        if key in self._cache:
            return self._cache[key]
        if path not in self._files:
            if len(self._files) >= self.max_files:  # whole files are kept: few of them
                self._files.clear()
            self._files[path] = self._read(pid, path)
        lines = self._files[path]
        text = lines[lineno - 1].strip()[:200] if lines and 0 < lineno <= len(lines) else ""
        if len(self._cache) < self.max_entries:
            self._cache[key] = text
        return text

    def _read(self, pid: int, path: str) -> list[str] | None:
        """The lines of the file a frame of `pid` names, None when it is not to be read."""
        if pid not in self._readers:
            if len(self._readers) >= self.max_files:
                self._readers.clear()
            self._readers[pid] = reader_of(pid)
        reader = self._readers[pid]
        if reader is None:
            return None
        for cand in (path, f"/proc/{pid}/root{path}"):
            try:
                data = read_regular(cand, MAX_SOURCE_BYTES, reader=reader)
            except OSError:  # FileRefused too: not a regular file, too large, not theirs
                continue
            return data.decode("utf-8", errors="replace").splitlines()
        return None
