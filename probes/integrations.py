"""Callbacks for PyTorch Lightning and the Hugging Face Trainer: they call `instrument()`
when training starts, so `gpudiag attach PID` gets exact step timing from jobs those
frameworks run. The frameworks are optional: import errors say what to install.

    trainer = lightning.Trainer(callbacks=[lightning_callback()])
    trainer = transformers.Trainer(..., callbacks=[hf_callback()])
"""

from __future__ import annotations

from typing import Any

from gpudiag.probes.inject.gpudiag_hooks import instrument


def lightning_callback() -> Any:
    """A Lightning Callback that hooks the job at setup."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback  # type: ignore[assignment]  # the older package, same class
        except ImportError:
            raise ImportError(
                "lightning_callback() needs PyTorch Lightning: pip install lightning"
            ) from None

    class GpudiagCallback(Callback):
        """Installs gpudiag's in-process hooks when training is set up."""

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            instrument()

    return GpudiagCallback()


def hf_callback() -> Any:
    """A transformers TrainerCallback that hooks the job when training begins."""
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("hf_callback() needs transformers: pip install transformers") from None

    class GpudiagCallback(TrainerCallback):
        """Installs gpudiag's in-process hooks at the start of training."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            instrument()

    return GpudiagCallback()
