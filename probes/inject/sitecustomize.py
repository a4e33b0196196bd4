"""gpudiag's sitecustomize: hooks a job launched by `gpudiag run`, then chains the real one.

It does nothing unless GPUDIAG_CHANNEL names the agent's socket; then it installs gpudiag's
in-process hooks when (and only when) the job imports torch. Any sitecustomize that was
already on the path still runs after it.
"""

import os
import sys


def _gpudiag_hook() -> None:
    # gpudiag_channel.CHANNEL_ENV, spelled here so that a process without it imports nothing
    if not os.environ.get("GPUDIAG_CHANNEL"):
        return
    try:
        import gpudiag_hooks

        gpudiag_hooks.install_on_torch_import()
    except Exception as exc:  # never break the job
        print(f"gpudiag: in-process hooks not installed: {exc}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        if folder == here:
            continue
        candidate = os.path.join(folder, "sitecustomize.py")
        if os.path.isfile(candidate):
            import importlib.util

            spec = importlib.util.spec_from_file_location(
                "_gpudiag_chained_sitecustomize", candidate
            )
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                sys.modules["_gpudiag_chained_sitecustomize"] = module
                spec.loader.exec_module(module)
            return


_gpudiag_hook()
_chain()
