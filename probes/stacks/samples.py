"""The samples the stack probe emits for one py-spy window: stacks, call episodes, and the
window's totals (for the loop process and for the DataLoader workers sampled in turns)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudiag.probes.base import Field, Sample
from gpudiag.probes.stacks.pyspy import SpyRun
from gpudiag.probes.stacks.pyspy_output import Episode, StackRow

# every value the stack probe reports, with its unit and kind
STACK_FIELDS = (
    Field(
        "count",
        "samples",
        "counter",
        "stack samples of one thread with one stack (workers: weighted, see weight)",
    ),
    Field(
        "weight",
        "ratio",
        "gauge",
        "factor a worker's raw sample count was scaled by: "
        "workers alive / workers recorded x loop rate / worker rate",
    ),
    Field("ticks", "samples", "counter", "sampling ticks in a window"),
    Field("duration_s", "s", "gauge", "length of a sampling window"),
    Field("rate_hz", "Hz", "gauge", "sampling rate of a window"),
    Field("errors", "count", "counter", "samples py-spy failed to take in a window"),
    Field("episodes", "count", "counter", "separate runs of samples inside one library call"),
    Field("workers", "count", "gauge", "child processes alive when a worker window started"),
    Field("recorded", "count", "gauge", "child processes recorded in a worker window"),
    Field(
        "seen",
        "count",
        "gauge",
        "a line of the job that calls a torch module (kind=source: its file, line and text)",
    ),
)


@dataclass(frozen=True)
class Tally:
    """How a stack row counts: its process's role ("target" or "worker"), its count, and the
    weight a worker's count was scaled by (None for the target's)."""

    role: str
    count: float
    weight: float | None = None


def stack_sample(probe: str, t: int, mode: str, r: StackRow, code: str, tally: Tally) -> Sample:
    """One stack of one thread and how often it was seen (weighted for workers)."""
    role, count, weight = tally.role, tally.count, tally.weight
    values: dict[str, float | None] = {"count": count}
    if weight is not None:
        values["weight"] = weight
    labels = {
        "mode": mode,
        "kind": "stack",
        "pid": str(r.pid),
        "tid": str(r.tid),
        "thread": r.thread,
        "role": role,
        "stack": ";".join(r.frames),
        "code": code,
    }
    return Sample(probe, t, labels, values)


def episode_sample(probe: str, t: int, mode: str, e: Episode) -> Sample:
    """Consecutive samples inside one call (one torch.save): how many calls, how long."""
    labels = {
        "mode": mode,
        "kind": "episode",
        "pid": str(e.pid),
        "tid": str(e.tid),
        "thread": e.thread,
        "anchor": e.anchor,
    }
    return Sample(probe, t, labels, {"episodes": float(e.episodes), "count": float(e.count)})


def window_sample(probe: str, t: int, run: SpyRun, ticks: int, duration: float) -> Sample:
    """A recorder's window: its ticks, length, rate and the errors py-spy reported."""
    m = re.search(r"Errors:\s*(\d+)", run.err)
    values: dict[str, float | None] = {
        "ticks": float(ticks),
        "duration_s": duration,
        "rate_hz": float(run.rate),
        "errors": float(m.group(1)) if m else 0.0,
    }
    return Sample(probe, t, {"mode": run.mode, "kind": "window"}, values)


@dataclass(frozen=True)
class WorkersTurn:
    """The workers' turn in a window: their recorders' rate, how many workers were alive and
    how many recorded, and the weight their counts got."""

    rate: float
    alive: int
    recorded: int
    weight: float


def workers_window_sample(probe: str, t: int, duration: float, turn: WorkersTurn) -> Sample:
    """The workers' turn in a window: how many were alive, recorded, and their weight."""
    values: dict[str, float | None] = {
        "duration_s": duration,
        "rate_hz": float(turn.rate),
        "workers": float(turn.alive),
        "recorded": float(turn.recorded),
        "weight": turn.weight,
    }
    return Sample(probe, t, {"mode": "workers", "kind": "window"}, values)


# torch's module-call frames ("Module._call_impl (.../torch/nn/modules/module.py:1786)")
_MODULE_CALL = re.compile(r"(^|\.)_(wrapped_)?call_impl \(.*torch/nn/modules/module\.py:\d+\)$")


def module_call_sites(frames: tuple[str, ...]) -> list[str]:
    """The frames that call a torch module in a root-first stack: the frame just before each
    run of module-call frames (the parent's line, `self.head(x)`)."""
    out = []
    for i in range(1, len(frames)):
        if _MODULE_CALL.search(frames[i]) and not _MODULE_CALL.search(frames[i - 1]):
            out.append(frames[i - 1])
    return out


def source_sample(probe: str, t: int, frame: str, code: str) -> Sample:
    """The text of a line that calls a module (the report names the call by it)."""
    lpar, colon = frame.rfind(" ("), frame.rfind(":")
    labels = {
        "kind": "source",
        "file": frame[lpar + 2 : colon],
        "line": frame[colon + 1 : -1],
        "code": code,
    }
    return Sample(probe, t, labels, {"seen": 1.0})
