"""The Python API for jobs gpudiag does not launch (cluster launchers, notebooks).

    from gpudiag.probes.hooks import instrument
    instrument()          # at the top of the training script

then `gpudiag attach PID` receives the same exact step timing as `gpudiag run` gives.
"""

from gpudiag.probes.inject.gpudiag_hooks import attach_path, instrument

__all__ = ["instrument", "attach_path"]
