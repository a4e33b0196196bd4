"""DIST002: a distributed job that makes no progress, explained from every rank's stack and its
collective sequence numbers: which ranks wait in a collective, which rank is not in it, where
that rank is. Pure: the agent gathers the dumps and the hooks' state."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpudiag.analyzers.catalogue import severity, spec
from gpudiag.analyzers.distributed import _loc
from gpudiag.analyzers.results import Evidence, Finding, Recommendation
from gpudiag.analyzers.rules import parse_frame
from gpudiag.analyzers.thresholds import Thresholds

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


def is_hung(ranks: list[HangRank], th: Thresholds) -> float | None:
    """Seconds since any rank finished a step, when that is at least dist_hang_s and every
    rank has stepped before; None otherwise (not hung, or no step signal)."""
    ages = [r.last_step_age_s for r in ranks]
    if not ranks or any(a is None for a in ages) or any(r.steps <= 0 for r in ranks):
        return None
    quiet = min(a for a in ages if a is not None)
    return quiet if quiet >= th.dist_hang_s else None


def hang_finding(ranks: list[HangRank], quiet_s: float, th: Thresholds) -> Finding:
    """DIST002 for ranks that made no step for `quiet_s` seconds."""
    waiting: dict[int, str] = {}
    for r in ranks:
        op = r.inside_op or stack_collective(r.stack)
        if op:
            seq = f" #{r.inside_seq}" if r.inside_seq is not None else ""
            waiting[r.rank] = f"{op}{seq}"
    guilty = [r for r in ranks if r.rank not in waiting]
    if waiting and guilty:
        first = sorted(waiting.items())[0][1]
        where = []
        for g in guilty:
            at = user_frame(g.stack) or (g.stack[0] if g.stack else "stack not read")
            behind = ""
            seqs = [r.inside_seq for r in ranks if r.inside_seq is not None]
            if seqs and g.seq is not None:
                behind = f", {max(seqs) - g.seq} collective(s) behind (its last was #{g.seq})"
            where.append(f"rank {g.rank} is not in it: it is at {at}{behind}")
        msg = (
            f"no rank finished a step for {quiet_s:.0f} s. Rank(s) "
            f"{', '.join(str(k) for k in sorted(waiting))} wait in {first}; "
            + "; ".join(where)
            + "."
        )
        summary = f"Find why rank {guilty[0].rank} never reaches {first.split()[0]}"
        loc = _loc(user_frame(guilty[0].stack))
    elif waiting:
        seqs = {r.rank: r.inside_seq for r in ranks if r.inside_seq is not None}
        if len(set(seqs.values())) > 1:
            low = min(seqs.values())
            behind = [k for k, v in seqs.items() if v == low]
            msg = (
                f"no rank finished a step for {quiet_s:.0f} s; every rank is inside a "
                f"collective but not the same one: "
                + ", ".join(f"rank {k} in {v}" for k, v in sorted(waiting.items()))
                + f". Rank(s) {', '.join(map(str, behind))} are behind (collective #{low}): "
                "the ranks call collectives in a different order"
            )
            summary = "Make every rank call the same collectives in the same order"
        else:
            msg = (
                f"no rank finished a step for {quiet_s:.0f} s; every rank is inside "
                f"{sorted(waiting.values())[0]}: the collective itself does not complete "
                "(network, NCCL transport or a rank on another host)"
            )
            summary = "Check the transport (NCCL_DEBUG=INFO) and the ranks on other hosts"
        loc = None
    else:
        msg = (
            f"no rank finished a step for {quiet_s:.0f} s and no rank is inside a collective: "
            "the job is stuck in its own code (see each rank's stack)"
        )
        summary = "See each rank's stack below"
        loc = _loc(user_frame(ranks[0].stack)) if ranks else None
    return Finding(
        id="DIST002",
        title=spec("DIST002").title,
        severity=severity("DIST002", 1.0, th),
        confidence=0.9 if waiting else 0.6,
        impact=1.0,
        message=msg,
        evidence=(
            Evidence(
                "seconds_without_step", round(quiet_s, 1), "s", th.dist_hang_s, ">=", "dist_hang_s"
            ),
        ),
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
        speedup_basis="a hang: the job makes no progress until it is fixed",
    )
