"""Debugging switches left on that cost the loop every step, as the stacks and the hooks show
them: autograd's anomaly detection records the Python stack of every op a forward runs
(`torch.fx.traceback.format_stack`, called from the op's own frame by torch's C++), and checks
every gradient of the backward for NaN. The hooks read the switch itself
(`torch.is_anomaly_enabled()`); the stacks show what its records cost, with or without them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudiag.analyzers.measures.loop import LoopProfile
from gpudiag.analyzers.measures.rules import Classifier, Frame, parse_stack
from gpudiag.analyzers.timeline.timeline import Aggregate

# The stack record: torch.fx.traceback.format_stack (the standard library's before torch 1.13)
_RECORD_FILE_RE = re.compile(r"(^|/)(torch/fx/traceback|traceback)\.py$")
# ... called by torch's C++ from an op's frame: not by the tracers that call it themselves
# (torch.fx's proxies, dynamo, inductor, export, functorch: compiling, not recording an op)
_TORCH_RE = re.compile(r"(^|/)torch/")
_TRACER_RE = re.compile(r"(^|/)torch/(fx|_dynamo|_inductor|export|_export|_functorch)/")


@dataclass(frozen=True)
class AnomalySeen:
    """Anomaly detection as seen: the switch (hooks; None without them) and the share of the
    loop's stack samples recording a stack for it."""

    on: bool | None
    check_nan: bool | None
    record_share: float
    record_samples: float
    samples: float


def is_anomaly_record(frames: tuple[Frame, ...]) -> bool:
    """Whether a root-first stack is inside anomaly detection's stack record: a
    `format_stack` frame whose caller is torch's own op frame (not the job's code, not a
    tracer's)."""
    for caller, fr in zip(frames, frames[1:], strict=False):
        if fr.function == "format_stack" and _RECORD_FILE_RE.search(fr.file):
            return bool(_TORCH_RE.search(caller.file)) and not _TRACER_RE.search(caller.file)
    return False


def _switch(view: Aggregate, name: str) -> bool | None:
    """Whether the hooks saw the switch on (None when they never reported switches)."""
    seen = view.matching("hooks", name, kind="switches")
    if not seen:
        return None
    return any((r.maximum or 0.0) >= 1.0 for _, r in seen if r.count)


def anomaly_seen(view: Aggregate, profile: LoopProfile, clf: Classifier) -> AnomalySeen:
    """Anomaly detection in the loop: the hooks' switch and the stacks' record share."""
    records = 0.0
    if profile.thread is not None and profile.samples > 0:
        for (stack, code), n in view.stacks.get(profile.thread, {}).items():
            if is_anomaly_record(parse_stack(stack)) and clf.category(stack, code) != "startup":
                records += n
    share = records / profile.samples if profile.samples > 0 else 0.0
    return AnomalySeen(
        _switch(view, "anomaly_mode"),
        _switch(view, "anomaly_check_nan"),
        min(1.0, share),
        records,
        profile.samples,
    )


@dataclass(frozen=True)
class Setting:
    """One row of the table of torch's global settings the hooks read (at start and every few
    seconds): the field they send, what they read, the slow value, what it costs, how to
    change it, whether it costs on a CPU too, and the finding that names it (None: read and
    reported, not a cause by itself)."""

    field: str
    reads: str
    slow: str
    costs: str
    change: str
    on_cpu: bool
    finding: str | None


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "anomaly_mode",
        "torch.is_anomaly_enabled()",
        "on",
        "every op of every forward records its Python stack, and the backward checks every "
        "gradient for NaN (on a GPU a sync per gradient): measured 2.4-6.8 times its stack "
        "records' share of the loop on a CPU",
        "torch.autograd.set_detect_anomaly(False); Lightning: Trainer(detect_anomaly=False)",
        True,
        "DEBUG001",
    ),
    Setting(
        "deterministic_algorithms",
        "torch.are_deterministic_algorithms_enabled()",
        "on",
        "ops with a deterministic variant run it (on CUDA: index_add, scatter_add, "
        "cumsum, embedding and interpolation backwards, serialised or slower); cuBLAS needs "
        "its workspace config; an op with none raises",
        "torch.use_deterministic_algorithms(False) outside a run that must be reproducible",
        True,
        "DEBUG001",
    ),
    Setting(
        "cudnn_deterministic",
        "torch.backends.cudnn.deterministic",
        "on",
        "cuDNN convolutions limited to its deterministic algorithms (often slower ones)",
        "torch.backends.cudnn.deterministic = False",
        False,
        "DEBUG001",
    ),
    Setting(
        "matmul_precision_highest",
        "torch.get_float32_matmul_precision()",
        "'highest' (torch's default)",
        "fp32 matmuls without TF32 tensor cores on Ampere and newer GPUs: GPU003 names it "
        "where the GPU's matrix work is fp32",
        "torch.set_float32_matmul_precision('high') (changes numerics)",
        False,
        "GPU003",
    ),
    Setting(
        "cudnn_benchmark",
        "torch.backends.cudnn.benchmark",
        "off (torch's default)",
        "cuDNN picks each convolution's algorithm by heuristics instead of timing them; with "
        "fixed input shapes, timing finds faster ones",
        "torch.backends.cudnn.benchmark = True (inputs of fixed shape)",
        False,
        None,
    ),
)


def settings_read(view: Aggregate) -> dict[str, bool | None]:
    """Each setting's field: whether the hooks ever read it on (None: never read)."""
    return {s.field: _switch(view, s.field) for s in SETTINGS}


def debugging_on(view: Aggregate, gpu: bool) -> tuple[Setting, ...]:
    """The debugging switches besides anomaly detection the hooks read on, that cost on
    this job's device (DEBUG001 names them with it)."""
    read = settings_read(view)
    return tuple(
        s
        for s in SETTINGS
        if s.finding == "DEBUG001"
        and s.field != "anomaly_mode"
        and read[s.field]
        and (gpu or s.on_cpu)
    )
