"""In-process count of the padding in a model's forwards: the attention mask a transformer is
given (`model(**batch)`, a sentence-transformers features dict, a BatchEncoding) says how many
of the tokens it computes are real. One row a forward: [end (Unix s), rows, tokens (rows x
padded length), real tokens (the mask's ones), tokens had each row been padded only to the
batch's longest].

Runs inside the job and imports nothing from gpudiag. It only reads the mask. A mask on the
CPU is summed at once (microseconds); a mask on a GPU is summed on the GPU, its two numbers
copied to pinned host memory without waiting, and read once its event says the copy is done:
the job's stream is never synchronised (1 forward in `GPU_EVERY`, at most `MAX_PENDING`
unread)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

MASK_KEY = "attention_mask"
GPU_EVERY = 4  # a mask on a GPU: one forward in this many is counted
MAX_PENDING = 16  # GPU counts not yet read; more are skipped


def attention_mask(args: tuple, kwargs: dict | None) -> Any:
    """The 2-D attention mask among a forward's inputs: a keyword argument, or an entry of a
    dict among them (None when there is none)."""
    kwargs = kwargs or {}
    mask = kwargs.get(MASK_KEY)
    if mask is None:
        for v in list(args) + list(kwargs.values()):
            if isinstance(v, Mapping) and v.get(MASK_KEY) is not None:
                mask = v.get(MASK_KEY)
                break
    shape = getattr(mask, "shape", None)
    if shape is None or not hasattr(mask, "device") or len(shape) != 2:
        return None
    if shape[0] < 1 or shape[1] < 1:
        return None
    return mask


class Padding:
    """Rows of padding counts since the last `take()`."""

    def __init__(self, max_rows: int = 20000) -> None:
        self.lock = threading.Lock()
        self.rows: list[list[float]] = []
        self.pending: deque = deque()  # (event, pinned counts, end, rows, width): GPU masks
        self.seen = 0  # GPU masks seen (one in GPU_EVERY counted)
        self.max_rows = max_rows

    def count(self, torch, mask, end: float) -> None:
        """Count one forward's mask, which ended at `end` (Unix s)."""
        rows, width = int(mask.shape[0]), int(mask.shape[1])
        kind = mask.device.type
        if kind == "cpu":
            lengths = mask.sum(dim=1)
            self._add(end, rows, width, float(lengths.sum()), float(lengths.max()))
        elif kind == "cuda":
            self._count_on_gpu(torch, mask, end, rows, width)

    def _count_on_gpu(self, torch, mask, end: float, rows: int, width: int) -> None:
        self.seen += 1
        self.read_done()
        if self.seen % GPU_EVERY or len(self.pending) >= MAX_PENDING:
            return
        lengths = mask.sum(dim=1)
        counts = torch.stack((lengths.sum(), lengths.max()))
        host = torch.empty(2, dtype=counts.dtype, pin_memory=True)
        host.copy_(counts, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pending.append((event, host, end, rows, width))

    def read_done(self) -> None:
        """Read the GPU counts whose copies are done, oldest first, without waiting."""
        while self.pending and self.pending[0][0].query():
            _, host, end, rows, width = self.pending.popleft()
            real, longest = host.tolist()
            self._add(end, rows, width, float(real), float(longest))

    def _add(self, end: float, rows: int, width: int, real: float, longest: float) -> None:
        if not (0 <= real <= rows * width and 0 <= longest <= width):
            return  # not a 0/1 mask (an additive one: 0 and -inf)
        with self.lock:
            if len(self.rows) < self.max_rows:
                self.rows.append([end, float(rows), float(rows * width), real, rows * longest])

    def take(self) -> list[list[float]]:
        """The rows counted so far (the GPU's done ones read first), handed over once."""
        try:
            self.read_done()
        except Exception:
            self.pending.clear()
        with self.lock:
            out, self.rows = self.rows, []
        return out

    def clear(self) -> None:
        """Drop everything (quiet, or a forked child: the parent's rows are the parent's)."""
        self.lock = threading.Lock()
        self.rows, self.pending = [], deque()
