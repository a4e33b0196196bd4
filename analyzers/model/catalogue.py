"""The finding catalogue: every finding id, its title, category, whether it can explain GPU
idle time, and how its severity follows from its impact. Analyzers ask this module; they
never match each other's id strings."""

from __future__ import annotations

from dataclasses import dataclass

from gpudiag.analyzers.model.results import Finding, Severity
from gpudiag.analyzers.model.thresholds import Thresholds


@dataclass(frozen=True)
class Spec:
    """One catalogue entry."""

    id: str
    title: str
    category: str  # host, gpu, transfer, distributed, cost, run
    explains_gpu_idle: bool  # a cause on the critical path: the GPU idles because of it
    error_setting: str | None = "error_impact"  # threshold naming the error impact; None: never
    always_note: bool = False  # informational: never a warning
    time_in: str | None = None  # the Breakdown category whose time the finding is about
    compares_ranks: bool = False  # decided by comparing every rank (merge decides it again)
    note_title: str | None = None  # the title of an informational finding of this id

    def finding(
        self,
        th: Thresholds,
        *,
        impact: float,
        severity_at: float | None = None,
        note: bool = False,
        detail: str = "",
        **fields,
    ) -> Finding:
        """A Finding of this id: its title from here (`detail` appended; `note_title` for a
        note) and its severity from its impact (or `severity_at`), `note` forcing a note;
        the rest (confidence, message, evidence, fix, speed-up and its basis...) as given."""
        title = (self.note_title if note and self.note_title else self.title) + (
            f" {detail}" if detail else ""
        )
        at = impact if severity_at is None else severity_at
        level: Severity = "note" if note else severity(self.id, at, th)
        return Finding(id=self.id, title=title, severity=level, impact=impact, **fields)


CATALOGUE: dict[str, Spec] = {
    s.id: s
    for s in (
        Spec(
            "DATA001",
            "Loop waits on the input pipeline (the DataLoader)",
            "host",
            True,
            "data_wait_error",
            time_in="data_wait",
        ),
        Spec(
            "DATA002",
            "Input pipeline is CPU-bound and the cores are already busy",
            "host",
            True,
            "data_wait_error",
            time_in="data_wait",
        ),
        Spec(
            "DATA003",
            "DataLoader workers re-created every epoch",
            "host",
            True,
            "data_wait_error",
            time_in="data_wait",
        ),
        Spec("IO001", "Input pipeline waits on storage reads", "host", True, time_in="storage_io"),
        Spec(
            "GIL001",
            "Python threads contend for the GIL and starve the loop",
            "host",
            True,
            time_in="gil_wait",
        ),
        Spec(
            "CKPT001",
            "Synchronous checkpoint saves stall training",
            "host",
            True,
            "checkpoint_error",
            time_in="checkpoint",
        ),
        Spec(
            "SYNC001",
            "Host-device syncs in the loop leave the GPU idle",
            "host",
            True,
            time_in="sync",
        ),
        Spec(
            "HOST001", "Host-bound: the loop thread's CPU work is the critical path", "host", True
        ),
        Spec(
            "HOST002",
            "Other processes on the box take the CPU the job's threads need",
            "host",
            True,
            note_title="Other processes on the box take CPU, but the GPU does not wait for it",
        ),
        Spec(
            "BLOCK001",
            "A blocking call in the loop holds every step (network, logging, sleep, upload)",
            "host",
            True,
        ),
        Spec(
            "DEBUG001",
            "Autograd anomaly detection left on: every op records its stack",
            "host",
            True,
            note_title="Autograd anomaly detection is on; its measured cost is under the "
            "warning threshold",
        ),
        Spec(
            "LOOP001",
            "Loop time no catalogued cause explains",
            "host",
            True,
            note_title="Loop time no catalogued cause explains, under the warning threshold",
        ),
        Spec(
            "HOST003",
            "The job's own threads oversubscribe the CPU",
            "host",
            True,
            note_title="The job's own threads oversubscribe the CPU, but the GPU does not wait",
        ),
        Spec("EVAL001", "Evaluation inside the training loop", "run", False),
        Spec(
            "XFER001", "Host-to-device copies stall the loop", "transfer", True, time_in="h2d_copy"
        ),
        Spec("GPU001", "GPU idle most of the time; neither side explains the gaps", "gpu", False),
        Spec("GPU002", "Launch-bound: the GPU looks busy but its SMs are mostly idle", "gpu", True),
        Spec("GPU003", "Matrix work not on tensor cores (fp32 without TF32/AMP)", "gpu", False),
        Spec("GPU004", "GPUs of the job are unevenly loaded", "gpu", False),
        Spec(
            "MEM001",
            "VRAM headroom: the job uses a small share of GPU memory",
            "gpu",
            False,
            None,
            always_note=True,
        ),
        Spec("MEM002", "VRAM near the limit", "gpu", False, None),
        Spec(
            "THROT001",
            "GPU clocks throttled",
            "gpu",
            False,
            note_title="GPU at its power limit (normal under full load)",
        ),
        Spec("COST001", "Money spent on GPU time the job leaves idle", "cost", False, None),
        Spec(
            "START001",
            "Start-up takes a large share of the run",
            "run",
            False,
            None,
            always_note=True,
        ),
        Spec(
            "DIST001",
            "A straggler rank makes the other ranks wait in collectives",
            "distributed",
            False,
            time_in="collective",
            compares_ranks=True,
        ),
        Spec(
            "DIST002",
            "Hang: no rank makes progress; a rank is not in the collective the others wait in",
            "distributed",
            False,
        ),
        Spec(
            "DIST003",
            "Communication-bound: every rank spends a large share of its step in collectives",
            "distributed",
            False,
            time_in="collective",
            compares_ranks=True,
        ),
        Spec(
            "SERVE001",
            "One request per forward while several are in flight: batch them",
            "gpu",
            False,
            None,  # a warning at most: whether batching helps is a hypothesis until measured
        ),
        Spec(
            "INFER001",
            "Inference with autograd on",
            "host",
            False,
            None,  # a warning at most: what inference mode gives back is a hypothesis
        ),
        Spec("SERVE002", "The request path is bound by host work", "host", False),
        Spec(
            "INFER003",
            "Most of the tokens the model computes are padding",
            "gpu",
            False,
            None,  # a warning at most: what the model's time gives back is a hypothesis
        ),
        Spec(
            "INFER002",
            "Small batches leave the GPU idle in a batch-inference loop",
            "gpu",
            True,
            None,  # a warning at most: whether a larger batch helps is a hypothesis
        ),
        Spec("SERVE003", "The server holds a GPU that idles most of the time", "cost", False, None),
        Spec("SERVE005", "The model is loaded on the request path, per request", "host", False),
        Spec("INFER004", "The model is loaded again for every batch", "host", True),
        Spec(
            "SERVE004",
            "The model runs on the server's event loop: requests wait for each other",
            "host",
            False,
            None,  # a warning at most: what running it off the loop gives back is a hypothesis
        ),
    )
}


def spec(finding_id: str) -> Spec:
    """The catalogue entry of an id (KeyError for an unknown id: add it here first)."""
    return CATALOGUE[finding_id]


def new_finding(finding_id: str, th: Thresholds, **fields) -> Finding:
    """A Finding of `finding_id`, built by its catalogue entry (see `Spec.finding`)."""
    return spec(finding_id).finding(th, **fields)


def severity(finding_id: str, impact: float, th: Thresholds) -> Severity:
    """error, warning or note for a finding of this id at this impact."""
    s = spec(finding_id)
    if s.always_note:
        return "note"
    if s.error_setting is not None and impact >= getattr(th, s.error_setting):
        return "error"
    return "warning"


def explains_gpu_idle(finding_id: str) -> bool:
    """Whether a finding of this id is a cause of GPU idle time (on the critical path)."""
    return spec(finding_id).explains_gpu_idle


def about_time_in(findings: list, breakdown_category: str) -> bool:
    """Whether any of `findings` is about time spent in this Breakdown category (e.g. any
    finding about checkpoint saves), whatever its id."""
    return any(spec(f.id).time_in == breakdown_category for f in findings)


def compares_ranks(finding_id: str) -> bool:
    """Whether a finding of this id is decided by comparing the ranks (a straggler, every rank
    communication-bound): a merge of per-host reports decides it again over all the ranks."""
    return spec(finding_id).compares_ranks


def category(finding_id: str) -> str:
    """host, gpu, transfer, distributed, cost or run."""
    return spec(finding_id).category


def _get(f, key: str):
    return f[key] if isinstance(f, dict) else getattr(f, key)


def ranked(findings: list) -> list:
    """Findings (objects or report dicts) largest impact first (ties by id): the one ranking
    `analyze`, the multi-rank session and `merge` share; a hypothesis after the rest. A cause
    in the box (HOST002) ranks by its impact like any other: beside a process burning one of
    2 cores, the held-out jobs' planted fixes moved them x0.8-0.92 while giving the intra-op
    pool the core the other process left moved them x1.5-2.8 (docs/how-it-measures.md, 'A busy
    box')."""
    return sorted(findings, key=lambda f: (*_unverified(f), -_get(f, "impact"), _get(f, "id")))


def _unverified(f) -> tuple[int, float]:
    """Causes whose speed-up is measured, modelled or bounded first; then the causes whose
    speed-up is an unchecked hypothesis (a cause seen whose fix may not help, as batching on a
    CPU did not, never outranks one that will), among them by the share their low end surely
    gives back; then the notes (a cause under its warning threshold); last, what costs no
    time (money, memory headroom: impact 0), which never leads a verdict over a cause (a Flask
    server's verdict was COST001)."""
    kind = f.get("speedup_kind") if isinstance(f, dict) else getattr(f, "speedup_kind", None)
    sev = f.get("severity") if isinstance(f, dict) else getattr(f, "severity", None)
    if sev == "note":  # under its threshold: after every warning
        return (2 if _get(f, "impact") > 0 else 3), 0.0
    if kind != "hypothesis":
        return (0 if _get(f, "impact") > 0 else 3), 0.0
    low = (f.get("speedup_low") if isinstance(f, dict) else getattr(f, "speedup_low", None)) or 1
    return 1, -(1.0 - 1.0 / max(1.0, low))
