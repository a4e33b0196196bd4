"""Why `gpudiag run`'s hooks cannot load in a process: its Python ignores PYTHONPATH (run
with -I, -E or -S, or embedded isolated, as a Triton Python backend's stub is), so the
sitecustomize that loads them is never imported."""

from __future__ import annotations

import os

import psutil

from gpudiag.probes.servers.triton import is_stub

ISOLATING = {"I": "-I", "E": "-E", "S": "-S"}  # python flags that skip PYTHONPATH or site


def python_flags(cmdline: list[str]) -> set[str]:
    """The interpreter's single-letter options before its script (`-IB` is I and B; -c and
    -m end them; -W and -X take a value, attached or the next argument)."""
    out: set[str] = set()
    args = iter(cmdline[1:])
    for arg in args:
        if not arg.startswith("-") or arg == "-" or arg.startswith("--"):
            break
        for i, ch in enumerate(arg[1:], 1):
            out.add(ch)
            if ch in "cm":
                return out
            if ch in "WX":
                if i == len(arg) - 1:
                    next(args, None)
                break
    return out


def hooks_blocked(pid: int, launched: list[str] | None = None) -> str | None:
    """Why the hooks cannot load in `pid` (its command line, or `launched` once it is gone),
    or None when nothing stands in their way."""
    try:
        proc = psutil.Process(pid)
        if is_stub(proc):
            return (
                "the profiled process is a Triton Python backend's stub, whose embedded "
                "Python runs isolated (it ignores PYTHONPATH)"
            )
        cmd = proc.cmdline()
    except psutil.Error:
        cmd = list(launched or [])
    if not cmd or not os.path.basename(cmd[0]).startswith("python"):
        return None
    flags = sorted(ISOLATING[f] for f in python_flags(cmd) if f in ISOLATING)
    if not flags:
        return None
    return f"the job's Python runs with {' '.join(flags)}, which skips PYTHONPATH or site"
