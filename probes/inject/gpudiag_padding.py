"""In-process count of the padding in a model's forwards: the attention mask a transformer is
given (`model(**batch)`, a sentence-transformers features dict, a BatchEncoding) says how long
each row really is. One row a counted forward: [end (Unix s), rows, tokens (rows x padded
length), real tokens (the mask's ones), rows x each batch's longest row, rows x the padded
length squared, rows x the longest squared] (the squares: attention's cost grows so). Every
`SUMMARY_EVERY_S`, a summary of the last `KEPT_ROWS` rows' lengths: [end, rows, tokens and
tokens squared had they been sorted by length and batched as the job batches them, the batch].

Runs inside the job and imports nothing from gpudiag. It only reads the mask. A mask on the
CPU is summed at once (microseconds); a mask on a GPU is summed on the GPU, its row lengths
copied to pinned host memory without waiting, and read once its event says the copy is done:
the job's stream is never synchronised (1 forward in `GPU_EVERY`, at most `MAX_PENDING`
unread)."""

from __future__ import annotations

import inspect
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

MASK_KEY = "attention_mask"
GPU_EVERY = 4  # a mask on a GPU: one forward in this many is counted
MAX_PENDING = 16  # GPU counts not yet read; more are skipped
KEPT_ROWS = 4096  # the row lengths the sorted-batches summary is made from
SUMMARY_EVERY_S = 2.0


_POSITIONS: dict[type, int | None] = {}  # a module class: where its forward takes the mask


def mask_position(module: Any) -> int | None:
    """The position of `attention_mask` among the module's forward's arguments (Hugging
    Face's models take it second), looked up once a class."""
    cls = type(module)
    if cls not in _POSITIONS:
        pos = None
        try:
            names = list(inspect.signature(module.forward).parameters)
            pos = names.index(MASK_KEY) if MASK_KEY in names else None
        except (TypeError, ValueError):
            pass
        if len(_POSITIONS) < 1024:
            _POSITIONS[cls] = pos
        return pos
    return _POSITIONS[cls]


def attention_mask(args: tuple, kwargs: dict | None, module: Any = None) -> Any:
    """The 2-D attention mask among a forward's inputs: a keyword argument, an entry of a
    dict among them, or the argument in its place (`model(ids, mask)`); None without one."""
    kwargs = kwargs or {}
    mask = kwargs.get(MASK_KEY)
    if mask is None:
        for v in list(args) + list(kwargs.values()):
            if isinstance(v, Mapping) and v.get(MASK_KEY) is not None:
                mask = v.get(MASK_KEY)
                break
    if mask is None and module is not None and args:
        pos = mask_position(module)
        mask = args[pos] if pos is not None and pos < len(args) else None
    shape = getattr(mask, "shape", None)
    if shape is None or not hasattr(mask, "device") or len(shape) != 2:
        return None
    if shape[0] < 1 or shape[1] < 1:
        return None
    return mask


def sorted_batches(lengths: list[int], batch: int) -> tuple[float, float]:
    """(tokens, tokens squared) of `lengths` sorted and cut into batches of `batch`, each
    padded to its longest row."""
    ordered = sorted(lengths)
    tokens = square = 0.0
    for i in range(0, len(ordered), batch):
        chunk = ordered[i : i + batch]
        tokens += chunk[-1] * len(chunk)
        square += chunk[-1] * chunk[-1] * len(chunk)
    return tokens, square


class Padding:
    """Rows of padding counts since the last `take()`."""

    def __init__(self, max_rows: int = 20000) -> None:
        self.lock = threading.Lock()  # the rows and the kept lengths
        self.gpu_lock = threading.Lock()  # the GPU counts waiting for their copies
        self.rows: list[list[float]] = []
        self.pending: deque = deque()  # (event, pinned lengths, end, width): GPU masks
        self.kept: deque = deque(maxlen=KEPT_ROWS)  # the last rows' real lengths
        self.batches: deque = deque(maxlen=64)  # the last forwards' row counts
        self.seen = 0  # GPU masks seen (one in GPU_EVERY counted)
        self.last_summary = time.monotonic()
        self.fresh = False  # rows kept since the last summary
        self.max_rows = max_rows

    def count(self, torch: Any, mask: Any, end: float) -> None:
        """Count one forward's mask, which ended at `end` (Unix s)."""
        width = int(mask.shape[1])
        kind = mask.device.type
        if kind == "cpu":
            self._add(end, width, mask.sum(dim=1).tolist())
        elif kind == "cuda":
            self._count_on_gpu(torch, mask, end, width)

    def _count_on_gpu(self, torch: Any, mask: Any, end: float, width: int) -> None:
        self.read_done()
        with self.gpu_lock:  # request threads forward at once: one counter, one queue
            self.seen += 1
            if self.seen % GPU_EVERY or len(self.pending) >= MAX_PENDING:
                return
            lengths = mask.sum(dim=1)
            host = torch.empty(lengths.shape, dtype=lengths.dtype, pin_memory=True)
            host.copy_(lengths, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.pending.append((event, host, end, width))

    def read_done(self) -> None:
        """Read the GPU counts whose copies are done, oldest first, without waiting."""
        done = []
        with self.gpu_lock:
            while self.pending and self.pending[0][0].query():
                done.append(self.pending.popleft())
        for _, host, end, width in done:
            self._add(end, width, host.tolist())

    def _add(self, end: float, width: int, lengths: list) -> None:
        if not lengths or not all(0 <= n <= width for n in lengths):
            return  # not a 0/1 mask (an additive one: 0 and -inf)
        rows, longest = len(lengths), max(lengths)
        row = [end, float(rows), float(rows * width), float(sum(lengths)), float(rows * longest)]
        row += [float(rows * width * width), float(rows * longest * longest)]
        with self.lock:
            self.kept.extend(lengths)
            self.batches.append(rows)
            self.fresh = True
            if len(self.rows) < self.max_rows:
                self.rows.append(row)

    def summary(self, now: float) -> list[list[float]]:
        """The sorted-batches summary row of the kept lengths, every SUMMARY_EVERY_S at most
        (a sort of KEPT_ROWS numbers: about a millisecond)."""
        if not self.fresh or now - self.last_summary < SUMMARY_EVERY_S:
            return []
        with self.lock:
            lengths, batches = list(self.kept), sorted(self.batches)
            self.fresh, self.last_summary = False, now
        batch = batches[len(batches) // 2] if batches else 0
        if batch < 2 or len(lengths) < 2 * batch:
            return []
        tokens, square = sorted_batches(lengths, batch)
        return [[time.time(), float(len(lengths)), tokens, square, float(batch)]]

    def take(self) -> tuple[list[list[float]], list[list[float]]]:
        """(the rows counted so far, the summary if one is due), handed over once; the GPU's
        done rows are read first."""
        try:
            self.read_done()
        except Exception:
            self.pending.clear()
        with self.lock:
            out, self.rows = self.rows, []
        return out, self.summary(time.monotonic())

    def clear(self) -> None:
        """Drop everything (quiet, or a forked child: the parent's rows are the parent's)."""
        self.lock, self.gpu_lock = threading.Lock(), threading.Lock()
        self.rows, self.pending = [], deque()
        self.kept, self.batches = deque(maxlen=KEPT_ROWS), deque(maxlen=64)
        self.fresh = False
