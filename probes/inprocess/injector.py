"""`attach --hooks` without gdb: pyinjector makes the job's main thread load a library that
queues the hooks' script (pendingso), driven by a one-shot helper process (ptrace_helper).

pyinjector is optional (`pip install 'gpudiag[hooks]'`): where it is installed it is used (a
failure is reported, gdb is not tried after it); without it, gdb.
The helper is this interpreter running gpudiag's own file, never the job's executable; it
gets the library on stdin and keeps it in an anonymous file, so nothing is written to disk.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from gpudiag.probes.inprocess import pendingso
from gpudiag.probes.spawn import run_process

HELPER = str(Path(__file__).with_name("ptrace_helper.py"))
HELPER_TIMEOUT_S = 30.0  # dlopen of a 5 KB library takes milliseconds; the rest is start-up
TRIES = 100  # attaches, 20 ms apart, until the main thread is at a safe place
INSTALL_HINT = "pip install pyinjector (or gpudiag[hooks])"


def _site() -> str | None:
    """The folder pyinjector is imported from here (the helper runs isolated: -I drops
    PYTHONPATH and the user's site-packages, where it may be), or None."""
    spec = importlib.util.find_spec("pyinjector")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(list(spec.submodule_search_locations)[0]).parent)


def missing() -> str | None:
    """Why pyinjector cannot load the hooks here (None: it can)."""
    if _site() is None:
        return "pyinjector is not installed"
    return pendingso.supported()


def inject(pid: int, script: str) -> tuple[bool, str]:
    """Queue `script` on `pid`'s main thread: (done, how long it stopped the thread, or why
    not)."""
    try:
        res = run_process(
            [sys.executable, "-I", HELPER, str(pid), str(TRIES), _site() or ""],
            input=pendingso.library(script),
            capture_output=True,
            timeout=HELPER_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"did not finish in {HELPER_TIMEOUT_S:.0f} s (stopped)"
    except (OSError, ValueError) as exc:
        return False, f"could not start: {exc}"
    try:
        out = json.loads(res.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (IndexError, ValueError):
        said = res.stderr.decode(errors="replace").strip().splitlines() or ["no answer"]
        return False, said[-1][:300]
    if not out.get("ok"):
        return False, str(out.get("error") or "failed")[:400]
    return True, f"the main thread stopped {out.get('stopped_ms', 0):.1f} ms"
