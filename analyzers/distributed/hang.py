"""DIST002: a distributed job that makes no progress, explained from every rank's stack and its
collective sequence numbers: which ranks wait in a collective, which rank is not in it, where
that rank is. Pure: the agent gathers the dumps and the hooks' state."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpudiag.analyzers.distributed.ranks import location as _loc
from gpudiag.analyzers.measures.rules import parse_frame
from gpudiag.analyzers.model.catalogue import Doc, Spec, new_finding, register
from gpudiag.analyzers.model.results import Evidence, Finding, Recommendation
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.dist.flight_recorder import RecorderRank

DIST002 = register(
    Spec(
        "DIST002",
        "Hang: no rank makes progress; a rank is not in the collective the others wait in",
        "distributed",
        False,
        doc=Doc(
            means=(
                "hang: no rank finished a step for `dist_hang_s` (or `dist_hang_steps` times the "
                "job's longest step; later while a rank is evaluating or saving); the rank(s) not"
                " in the collective the others wait in (DDP's gradient all-reduce included), "
                "where they are, how many collectives behind, with NCCL flight-recorder dumps "
                "merged in"
            ),
            fix="every rank's stack side by side, written while the job is still hung",
        ),
    )
)


_COLLECTIVE_FILE = re.compile(
    r"torch/distributed/(distributed_c10d|_functional_collectives|c10d_logger)|gpudiag_dist\.py$"
)
_LIB = re.compile(r"/lib/python\d+(\.\d+)?/|/site-packages/|/dist-packages/|^<|gpudiag_")


@dataclass(frozen=True)
class HangRank:
    """One rank at the moment of the hang: progress, collective state, main-thread stack."""

    rank: int
    pid: int | None = None
    host: str | None = None
    steps: int = 0
    last_step_age_s: float | None = None  # seconds since its last finished step
    seq: int | None = None  # collectives started (hooks)
    inside_op: str | None = None  # the collective it is inside now (hooks)
    inside_seq: int | None = None
    inside_s: float | None = None
    stack: tuple[str, ...] = field(default=())  # "function (file:line)", innermost first
    longest_step_s: float | None = None  # its longest interval between two steps so far
    recorder: RecorderRank | None = None  # what NCCL's flight recorder dumped for it


DDP_OP = "ddp_allreduce"  # the hooks' name for DDP's gradient all-reduce
_SAVING = re.compile(r"torch/serialization\.py|(^|[_.])(save|checkpoint)", re.I)
_EVAL = re.compile(
    r"(^|[_.])(eval|evaluate|evaluation|valid|validate|validation|test|predict)", re.I
)


def op_name(op: str) -> str:
    """A collective's name for the message."""
    return "DDP's gradient all-reduce (under loss.backward())" if op == DDP_OP else op


def phase_of(stack: tuple[str, ...]) -> tuple[str, str] | None:
    """("saving" | "evaluating", frame) when a stack is inside a save or an evaluation."""
    for text in stack:
        fr = parse_frame(text)
        if "torch/serialization.py" in fr.file or (
            not _LIB.search(fr.file) and _SAVING.search(fr.function)
        ):
            return "saving", f"{fr.file}:{fr.line}:{fr.function}"
        if not _LIB.search(fr.file) and _EVAL.search(fr.function):
            return "evaluating", f"{fr.file}:{fr.line}:{fr.function}"
    return None


def user_frames(stack: tuple[str, ...]) -> tuple[str, ...]:
    """A stack's frames outside libraries, by function and file (not line: a rank hung in a
    polling loop moves between its lines, never out of its functions)."""
    out = []
    for text in stack:
        fr = parse_frame(text)
        if not _LIB.search(fr.file):
            out.append(f"{fr.function} ({fr.file})")
    return tuple(out)


def hang_threshold(ranks: list[HangRank], th: Thresholds) -> tuple[float, str]:
    """The seconds without a step that make a hang: dist_hang_s, or dist_hang_steps times the
    job's longest step so far when that is longer; with the reason in words."""
    longest = max((r.longest_step_s or 0.0 for r in ranks), default=0.0)
    scaled = th.dist_hang_steps * longest
    if scaled > th.dist_hang_s:
        return scaled, (
            f"{th.dist_hang_steps} x the job's longest step so far ({longest:.1f} s; settings "
            f"dist_hang_steps, dist_hang_s={th.dist_hang_s:g})"
        )
    return th.dist_hang_s, f"dist_hang_s={th.dist_hang_s:g}"


def stack_collective(stack: tuple[str, ...]) -> str | None:
    """The collective a stack (innermost first) is inside, by its torch.distributed frame."""
    name = None
    for text in stack:
        fr = parse_frame(text)
        if _COLLECTIVE_FILE.search(fr.file) and not fr.function.startswith("_"):
            name = fr.function  # the outermost public collective frame
    return name


def user_frame(stack: tuple[str, ...]) -> str | None:
    """The innermost frame of the user's own code, as file:line:function."""
    for text in stack:
        fr = parse_frame(text)
        if fr.file and not _LIB.search(fr.file):
            return f"{fr.file}:{fr.line}:{fr.function}"
    return None


def is_hung(ranks: list[HangRank], th: Thresholds, early_s: float = 0.0) -> float | None:
    """Seconds since any rank finished a step, when that is at least the hang threshold (less
    `early_s`: a look that only suspects) and every rank has stepped before; None otherwise
    (not hung, or no step signal)."""
    ages = [r.last_step_age_s for r in ranks]
    if not ranks or any(a is None for a in ages) or any(r.steps <= 0 for r in ranks):
        return None
    quiet = min(a for a in ages if a is not None)
    return quiet if quiet >= hang_threshold(ranks, th)[0] - early_s else None


def recorder_lines(ranks: list[HangRank]) -> tuple[str, list[int]]:
    """The flight recorder's view in words, and the ranks it shows behind (their last entered
    collective is older than the others')."""
    rec = [r.recorder for r in ranks if r.recorder is not None]
    if not rec:
        return "", []
    parts = []
    for x in sorted(rec, key=lambda x: x.rank):
        e = f"#{x.last_entered[0]} {x.last_entered[1]}" if x.last_entered else "none"
        c = f"#{x.last_completed[0]}" if x.last_completed else "none"
        parts.append(f"rank {x.rank} last entered {e}, last completed {c}")
    entered = {x.rank: x.last_entered[0] for x in rec if x.last_entered}
    behind = []
    if len(set(entered.values())) > 1:
        low = min(entered.values())
        behind = sorted(k for k, v in entered.items() if v == low)
    text = "NCCL flight recorder: " + "; ".join(parts)
    if behind:
        text += f": rank(s) {', '.join(map(str, behind))} behind"
    return text, behind


def _waiting(ranks: list[HangRank], rec_behind: list[int]) -> dict[int, str]:
    """The ranks inside a collective, by rank: the collective, as the hooks, the stack or the
    flight recorder name it."""
    waiting: dict[int, str] = {}
    for r in ranks:
        op = r.inside_op or stack_collective(r.stack)
        if op:
            seq = f" #{r.inside_seq}" if r.inside_seq is not None else ""
            waiting[r.rank] = f"{op_name(op)}{seq}"
        elif r.recorder is not None and r.recorder.pending and r.rank not in rec_behind:
            e = r.recorder.last_entered
            waiting[r.rank] = f"{e[1]} #{e[0]} (flight recorder)" if e else "a collective"
    if rec_behind and not waiting:  # dumps only: the ranks ahead wait for those behind
        for r in ranks:
            if r.recorder is not None and r.rank not in rec_behind and r.recorder.last_entered:
                e = r.recorder.last_entered
                waiting[r.rank] = f"{e[1]} #{e[0]} (flight recorder)"
    return waiting


def _where(g: HangRank, ranks: list[HangRank]) -> str:
    """Where a rank outside the collective is, and how far behind."""
    at = user_frame(g.stack) or (g.stack[0] if g.stack else "stack not read")
    behind = ""
    seqs = [r.inside_seq for r in ranks if r.inside_seq is not None]
    if g.recorder is not None and g.recorder.last_entered:
        behind = f", its last collective was #{g.recorder.last_entered[0]} (flight recorder)"
    elif seqs and g.seq is not None:
        behind = f", {max(seqs) - g.seq} collective(s) behind (its last was #{g.seq})"
    return f"rank {g.rank} is not in it: it is at {at}{behind}"


def _all_waiting(quiet: str, ranks: list[HangRank], waiting: dict[int, str]) -> tuple[str, str]:
    """Every rank inside a collective: not the same one (order), or the same (transport)."""
    by_rank = {r.rank: r.inside_seq for r in ranks if r.inside_seq is not None}
    if len(set(by_rank.values())) > 1:
        low = min(by_rank.values())
        late = [k for k, v in by_rank.items() if v == low]
        msg = (
            f"{quiet}; every rank is inside a "
            f"collective but not the same one: "
            + ", ".join(f"rank {k} in {v}" for k, v in sorted(waiting.items()))
            + f". Rank(s) {', '.join(map(str, late))} are behind (collective #{low}): "
            "the ranks call collectives in a different order"
        )
        return msg, "Make every rank call the same collectives in the same order"
    msg = (
        f"{quiet}; every rank is inside "
        f"{sorted(waiting.values())[0]}: the collective itself does not complete "
        "(network, NCCL transport or a rank on another host)"
    )
    return msg, "Check the transport (NCCL_DEBUG=INFO) and the ranks on other hosts"


def hang_finding(ranks: list[HangRank], quiet_s: float | None, th: Thresholds) -> Finding:
    """DIST002 for ranks that made no step for `quiet_s` seconds (None: known only from the
    flight recorder's dumps, after the job stopped), live state merged with the recorder."""
    rec_text, rec_behind = recorder_lines(ranks)
    waiting = _waiting(ranks, rec_behind)
    quiet = (
        f"no rank finished a step for {quiet_s:.0f} s"
        if quiet_s is not None
        else "the job stopped in a collective (NCCL watchdog timeout)"
    )
    guilty = [r for r in ranks if r.rank not in waiting]
    if waiting and guilty:
        first = sorted(waiting.items())[0][1]
        where = [_where(g, ranks) for g in guilty]
        msg = (
            f"{quiet}. Rank(s) "
            f"{', '.join(str(k) for k in sorted(waiting))} wait in {first}; "
            + "; ".join(where)
            + "."
        )
        summary = f"Find why rank {guilty[0].rank} never reaches {first.split()[0]}"
        loc = _loc(user_frame(guilty[0].stack))
    elif waiting:
        msg, summary = _all_waiting(quiet, ranks, waiting)
        loc = None
    else:
        msg = (
            f"{quiet} and no rank is inside a collective: "
            "the job is stuck in its own code (see each rank's stack)"
        )
        summary = "See each rank's stack below"
        loc = _loc(user_frame(ranks[0].stack)) if ranks else None
    if rec_text:
        msg = f"{msg.rstrip('.')}. {rec_text}."
    limit, why = hang_threshold(ranks, th)
    scaled = limit > th.dist_hang_s
    longest = max((r.longest_step_s or 0.0 for r in ranks), default=0.0)
    ev = [th.evidence("dist_hang_steps", "longest_step_s", round(longest, 3), "s", "x", "hooks")]
    if quiet_s is not None:
        msg += f" (hang threshold {limit:.0f} s: {why})"
        setting = "dist_hang_steps" if scaled else "dist_hang_s"
        ev.insert(
            0,
            Evidence(
                "seconds_without_step", round(quiet_s, 1), "s", round(limit, 1), ">=", setting
            ),
        )
    return new_finding(
        "DIST002",
        th,
        confidence=0.9 if waiting else 0.6,
        impact=1.0,
        message=msg,
        evidence=tuple(ev),
        recommendation=Recommendation(
            summary,
            (
                "compare the ranks' stacks in the report's distributed.hang.stacks",
                "set TORCH_FR_BUFFER_SIZE=2000 (TORCH_NCCL_TRACE_BUFFER_SIZE before torch 2.8) "
                "and TORCH_NCCL_DUMP_ON_TIMEOUT=1 for NCCL jobs so collectives' sequence "
                "numbers are kept",
            ),
        ),
        expected_speedup=1.0,
        location=loc,
        signals=("stacks", "hooks") if any(r.seq is not None for r in ranks) else ("stacks",),
        # (the flight recorder's dumps, when read, are named in the message)
        speedup_basis="a hang: the job makes no progress until it is fixed",
    )
