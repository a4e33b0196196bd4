"""`gpudiag attach --hooks`: the hooks `run` injects, loaded into a job that runs already.

The agent queues one tiny script on the job's main thread (Py_AddPendingCall on Python
3.10-3.13, called by a library pyinjector loads, or by gdb where pyinjector is not installed;
sys.remote_exec on 3.14+): it appends this folder to sys.path and calls
`install(channel, nonce)`, which installs gpudiag_hooks as `run`'s sitecustomize does (now if
torch is imported, else at its import) and answers on the channel with a hello carrying the
nonce, so the agent knows the hooks got in. Hooks already in the job (a second attach, an
`instrument()`-ed job) are reused. Nothing raised here ever reaches the job: each step is
guarded and `install` swallows everything. Imports nothing from gpudiag.
"""

from __future__ import annotations

import json
import os
import socket
import sys

try:
    from . import gpudiag_channel as _channel
except ImportError:  # loaded as a top-level module by the injected script
    import gpudiag_channel as _channel

HOOK_MODULES = ("gpudiag_hooks", "gpudiag.probes.inject.gpudiag_hooks")


def install(channel: str, nonce: str) -> None:
    """Load (or reuse) the hooks and say hello on `channel`; never raises."""
    try:
        hello = _install(channel)
    except BaseException as exc:  # noqa: BLE001 (the job must never see it)
        hello = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        _hello(channel, nonce, hello)
    except BaseException:  # noqa: BLE001,S110 (no agent: nothing to tell, nothing to break)
        pass


def _loaded():
    """The hooks module already installed in this job, or None."""
    for name in HOOK_MODULES:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "_state", None) is not None:
            return mod
    return None


def _install(channel: str) -> dict:
    """Install or reuse the hooks; what the hello tells the agent."""
    mod = _loaded()
    reused = mod is not None
    if mod is None:
        import gpudiag_hooks

        gpudiag_hooks.install_on_torch_import(channel, attached=True)
        mod = gpudiag_hooks
    state = mod.current()
    if reused and state is not None and state.channel.path != channel:
        if not _live(state.channel.path):  # never take the data of a live `gpudiag run`
            state.channel.path = channel
    if reused and state is not None and state.channel.path == channel:
        state.wake()  # hooks gone quiet when the last agent went: they time steps again
    return {
        "reused": reused,
        "torch": state is not None and state.torch is not None,
        "python": ".".join(map(str, sys.version_info[:3])),
        "channel": state is not None and state.channel.path == channel,
    }


def _live(path: str | None) -> bool:
    """Whether an agent's socket exists at `path`."""
    return path is not None and os.path.exists(path)


def _hello(channel: str, nonce: str, hello: dict) -> None:
    """One datagram to the agent: the nonce and what happened."""
    msg = {"v": 2, "pid": os.getpid(), "width": 9, "hello": dict(hello, nonce=nonce)}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.setblocking(False)
        if _channel.private_path(channel):
            sock.sendto(json.dumps(msg).encode() + b"\n", channel)
    finally:
        sock.close()
