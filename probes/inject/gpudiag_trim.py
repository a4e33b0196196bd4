"""gpudiag's own frames out of the job's tracebacks: the hooks wrap DataLoader's `__next__`
(and a few tensor methods), so an exception (Ctrl-C) raised below them passes through a
gpudiag frame. Python cannot drop a frame an exception has passed through, but it lets the
traceback's links be rewritten before it is printed: the excepthooks installed here unlink
every frame of gpudiag's injected modules, then hand the traceback to the hook that was
there before (the job's own, or Python's default)."""

import os
import sys
import threading
from types import TracebackType

OWN_FILES = frozenset({"gpudiag_hooks.py", "gpudiag_dist.py", "gpudiag_capture.py"})


def is_own(tb: TracebackType) -> bool:
    """Whether a traceback entry is a frame of gpudiag's injected modules."""
    return os.path.basename(tb.tb_frame.f_code.co_filename) in OWN_FILES


def trim(tb: TracebackType | None) -> TracebackType | None:
    """The traceback `tb` with gpudiag's frames unlinked (the frames themselves are kept)."""
    while tb is not None and is_own(tb):
        tb = tb.tb_next
    head = tb
    while tb is not None:
        nxt = tb.tb_next
        while nxt is not None and is_own(nxt):
            nxt = nxt.tb_next
        tb.tb_next = nxt
        tb = nxt
    return head


def _trim_chain(exc: BaseException | None) -> None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if exc.__traceback__ is not None:
            exc.__traceback__ = trim(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


def install() -> None:
    """Trim gpudiag's frames in what sys.excepthook and threading.excepthook print."""
    before = sys.excepthook

    def excepthook(kind, value, tb):
        try:
            _trim_chain(value)
            tb = trim(tb)
        except Exception:  # never lose the user's traceback
            pass
        before(kind, value, tb)

    sys.excepthook = excepthook
    before_thread = threading.excepthook

    def thread_hook(args):
        try:
            _trim_chain(args.exc_value)
        except Exception:
            pass
        before_thread(args)

    threading.excepthook = thread_hook
