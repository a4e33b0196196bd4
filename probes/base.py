"""Core probe types: what a probe declares, what it returns, and the target it watches."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class Field:
    """One value a probe reports: its name, unit, kind and meaning."""

    name: str
    unit: str
    kind: Literal["gauge", "counter"]
    description: str


@dataclass(frozen=True)
class ProbeStatus:
    """Whether a probe could start; when it could not, why and how to fix it."""

    name: str
    available: bool
    reason: str | None = None
    hint: str | None = None
    info: bool = False
    """True when `reason` is information (an optional source the job did not connect), not a
    fault; `hint` then says how to get it."""

    def to_dict(self) -> dict:
        """Return the JSON form used in reports."""
        out = {
            "name": self.name,
            "available": self.available,
            "reason": self.reason,
            "hint": self.hint,
        }
        if self.info:
            out["info"] = True
        return out


@dataclass(frozen=True)
class Sample:
    """One tick of one probe: values keyed by field name, with labels saying what they describe.

    `values` holds numbers, or None where a value was not available at this tick.
    """

    probe: str
    t_ns: int
    labels: dict[str, str] = field(default_factory=dict)
    values: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Return the JSON form used in recordings."""
        return {
            "probe": self.probe,
            "t_ns": self.t_ns,
            "labels": self.labels,
            "values": self.values,
        }

    @staticmethod
    def from_dict(d: dict) -> Sample:
        """Rebuild a sample from its JSON form."""
        return Sample(
            probe=str(d["probe"]),
            t_ns=int(d["t_ns"]),
            labels={str(k): str(v) for k, v in d.get("labels", {}).items()},
            values=dict(d.get("values", {})),
        )


@dataclass(frozen=True)
class Target:
    """The job being watched: its root pid. Children (DataLoader workers) are found live.
    `server`: the front end of a server whose model runs in worker processes, `pid` being its
    model worker: its whole tree is the job's, never "other processes on the box"."""

    pid: int
    server: int | None = None


def now_ns() -> int:
    """Wall-clock time in nanoseconds, the clock every sample uses."""
    return time.time_ns()


@runtime_checkable
class Probe(Protocol):
    """A source of samples. `open` never raises; `sample` may raise, and the agent records it.

    Probes subclass this protocol, which gives them the defaults of its optional parts:
    `buffered`, `problems`, `final_status`, `applies` and `describe` are what the session asks every
    probe at the end; `adaptive` probes are steered by the budget governor (`set_level`,
    `rates`, `level`, `cpu_goal`); `cpu_s`, `child_rss_bytes` and `shed_memory` are the
    helper processes' cost; a probe that `captures` takes `request_capture`. The session, the
    governor and `watch` ask these, never `hasattr`.
    """

    name: str
    fields: tuple[Field, ...]
    interval_s: float
    buffered: bool = False
    """Samples arrive late (per window): the session drains `sample` once more after close."""
    adaptive: bool = False
    """The budget governor turns its rates up and down (`set_level`, `rates`)."""
    captures: bool = False
    """It can ask the job for a profiler capture (`request_capture`: the in-process hooks)."""
    level: float | None = None
    """An adaptive probe's current level (None: it does not report one)."""
    cpu_goal: float | None = None
    """An adaptive probe's share of the CPU budget for its helpers (py-spy), set by the
    governor; None until then."""

    def open(self, target: Target) -> ProbeStatus:
        """Prepare to sample the target; say whether that is possible."""
        ...

    def sample(self) -> list[Sample]:
        """Take one tick of samples."""
        ...

    def close(self) -> None:
        """Release what `open` took."""
        ...

    def problems(self) -> list[str]:
        """Errors met while sampling, for the report's errors (the probe went on or stopped)."""
        return []

    def final_status(self) -> ProbeStatus | None:
        """The status to report once closed, where sampling changed what `open` said (a GPU
        lost, hooks that never reported); None keeps the status `open` returned."""
        return None

    def applies(self) -> bool:
        """Whether the job had what this probe reads (a probe of one server framework, in a
        job without it, is left out of the report)."""
        return True

    def describe(self) -> dict:
        """Facts about the hardware for the report's environment (driver, GPUs); {} if none."""
        return {}

    def set_level(self, level: float) -> None:
        """Sample at this share (0-1) of the configured rates (adaptive probes)."""
        return None  # a body: a default, not an abstract member of the protocol

    def rates(self) -> dict[str, float]:
        """The rates or intervals in force (adaptive probes); {} if none."""
        return {}

    def cpu_s(self) -> float:
        """CPU seconds its helper processes (py-spy) have used; 0 for none."""
        return 0.0

    def child_rss_bytes(self) -> int:
        """Resident memory of its helper processes; 0 for none."""
        return 0

    def shed_memory(self) -> None:
        """Drop what it can: the agent is over its memory budget."""
        return None  # a body: a default, not an abstract member of the protocol

    def request_capture(self, steps: int) -> bool:
        """Ask the job for a profiler capture of `steps` steps (probes that `captures`)."""
        return False

    def paced(self) -> bool:
        """True while an adaptive probe samples below its lowest rates to keep within its
        `cpu_goal` (the stacks resting between windows, or stopped): the governor then never
        raises its rates."""
        return False

    def notes(self) -> list[str]:
        """Lines for the log since the last call: a change in how it samples (paced,
        stopped, back to its rates); [] for none."""
        return []

    def live_status(self) -> ProbeStatus | None:
        """Its status while it samples, where that changed what `open` said (the stacks
        paced or stopped by their budget); None keeps the status `open` returned."""
        return None
