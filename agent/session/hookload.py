"""`attach --hooks`: load `run`'s in-process hooks into the running job's processes, wait a
bounded time for their hello on the private channel, and say how they got in or why not.

Opt-in: the default attach stays read-only. Whatever happens here, the attach carries on
with stacks as without `--hooks`; the hooks probe's status in the report tells the story.
"""

from __future__ import annotations

import contextlib
import os
import secrets

from gpudiag.probes.base import ProbeStatus
from gpudiag.probes.inprocess.channel import INJECT_DIR, LOADED, HookProbe
from gpudiag.probes.inprocess.loader import Loaded, load, script_text

HELLO_WAIT_S = 10.0  # after the script is queued: a job in Python answers in milliseconds
NO_DDP_HOOK = (
    "DDP's communication hook cannot be added to a running job (it is registered once and "
    "never removed): the all-reduce wait stays inferred from the collectives' timing"
)


def load_hooks(
    hooks: HookProbe, pids: list[int], wait_s: float = HELLO_WAIT_S, ranks: bool | None = None
) -> ProbeStatus:
    """Queue the hooks in every process of `pids` (hooks opened: its socket bound) and wait
    for their hellos; the hooks status the report shows (also kept in `hooks.loaded`).
    `ranks`: whether `pids` are a distributed job's ranks (default: more than one pid); a
    server's front end and workers are not."""
    if hooks.refused is not None or hooks.path is None:
        return hooks.refused or ProbeStatus(hooks.name, False, "the hooks' socket is not open")
    hooks.nonce = secrets.token_hex(8)
    script = script_text(INJECT_DIR, hooks.path, hooks.nonce)
    files = {pid: f"{hooks.path}.{pid}.py" for pid in pids}  # sys.remote_exec reads them
    loads = [load(pid, script, files[pid]) for pid in pids]
    hellos = hooks.await_hello([x.pid for x in loads if x.how], wait_s)
    for x in loads:  # a script queued but not run yet is kept: its job reads it when it can
        if x.pid in hellos or x.how is None:
            with contextlib.suppress(OSError):
                os.unlink(files[x.pid])
    ranks = len(pids) > 1 if ranks is None else ranks
    hooks.loaded = _status(hooks.name, loads, hellos, wait_s, ranks)
    return hooks.loaded


def _status(
    name: str, loads: list[Loaded], hellos: dict[int, dict], wait_s: float, ranks: bool
) -> ProbeStatus:
    """One status over every process: loaded, or why not with the fix."""
    parts = [_one(x, hellos.get(x.pid), wait_s) for x in loads]
    ok = [text for text, good, _ in parts if good]
    bad = [text for text, good, _ in parts if not good]
    hints = sorted({hint for _, good, hint in parts if hint and not good})
    if ranks:
        (ok if ok else bad).append(NO_DDP_HOOK)
    if not bad:
        return ProbeStatus(name, True, f"{LOADED} ({'; '.join(ok)})", info=True)
    words = "; ".join(bad + ok)
    where = "in every process " if len(loads) > 1 else ""
    return ProbeStatus(
        name,
        True,
        f"--hooks: not loaded {where}({words}); the stacks still give the estimates",
        "; ".join(hints) or None,
        info=True,
    )


def _one(x: Loaded, hello: dict | None, wait_s: float) -> tuple[str, bool, str | None]:
    """(what happened in one process, whether its hooks answered, the fix)."""
    if x.how is None:
        return f"pid {x.pid}: {x.reason}", False, x.hint
    if hello is None:
        return (
            f"pid {x.pid}: queued by {x.how} but no answer in {wait_s:.0f} s: the job's main "
            f"thread did not come back to Python ({thread_state(x.pid)}); the hooks load when "
            "it does, and stay quiet without gpudiag",
            False,
            "attach with --hooks again once the job's main thread runs Python code",
        )
    if hello.get("error"):
        return f"pid {x.pid}: the hooks failed inside the job ({hello['error']})", False, None
    words = [f"pid {x.pid} by {x.how}"]
    if hello.get("reused"):
        words.append("hooks already there reused")
    if not hello.get("torch"):
        words.append("torch not imported yet: they install at its import")
    if not hello.get("channel"):
        words.append("its hooks send to another live gpudiag")
    return ", ".join(words), True, None


def thread_state(pid: int) -> str:
    """What the job's main thread is doing, from /proc (R: in native code; S/D: blocked)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "its state could not be read"
    if state == "R":
        return "it runs native code (C) without returning to the interpreter"
    if state in ("S", "D"):
        return "it is blocked in C (a system call, a lock or I/O)"
    return f"its state is {state}"
