"""One-off stack dumps (`py-spy dump`): the main thread's Python stack of a process now, for
explaining a hang while the job is still hung."""

from __future__ import annotations

import json
import subprocess

from gpudiag.probes.spawn import run_process
from gpudiag.probes.stacks.pyspy import find_py_spy


def dump_main_stack(pid: int, timeout_s: float = 20.0) -> tuple[tuple[str, ...], str | None]:
    """The main thread's frames, innermost first, as "function (file:line)"; with the reason
    when they could not be read (empty frames then)."""
    exe = find_py_spy()
    if exe is None:
        return (), "py-spy executable not found"
    try:
        res = run_process(
            [exe, "dump", "--pid", str(pid), "--json"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return (), "py-spy dump timed out"
    if res.returncode != 0:
        lines = [ln for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
        return (), (lines[0] if lines else f"py-spy dump failed ({res.returncode})")[:200]
    try:
        threads = json.loads(res.stdout)
    except ValueError:
        return (), "py-spy dump gave no JSON"
    if not isinstance(threads, list) or not threads:
        return (), "py-spy dump found no threads"
    main = next((t for t in threads if t.get("os_thread_id") == pid), threads[0])
    frames = tuple(
        f"{f.get('name')} ({f.get('filename')}:{f.get('line')})"
        for f in main.get("frames") or []
        if isinstance(f, dict)
    )
    return frames, None
