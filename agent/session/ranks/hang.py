"""The hang watcher of a distributed job's ranks (DIST002): each rank's progress and collective
state from the hooks, its stack dumped when no rank steps, the NCCL flight recorder's dumps, and
the hang threshold scaled by the job's own longest step and the phase a rank is in."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from gpudiag.analyzers.distributed.hang import (
    HangRank,
    hang_finding,
    hang_threshold,
    is_hung,
    phase_of,
    stack_collective,
    user_frames,
)
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.dist.flight_recorder import PREFIX_ENV, read_dumps
from gpudiag.probes.dist.ranks import read_environ
from gpudiag.probes.stacks.dump import dump_main_stack


@dataclass
class HangState:
    """What the hang watcher keeps between its looks at a job's ranks (its RankSet owns one):
    when to look again, the stacks of a suspected hang to confirm, where the NCCL flight
    recorder writes and since when its dumps count."""

    recheck_at: float = 0.0
    suspect: dict | None = None  # stacks of a suspected hang, to confirm it
    fr_prefix: str | None = None
    wall_start: float = field(default_factory=time.time)


def hang_ranks(rs: Any) -> list[HangRank]:
    """Each rank's progress and collective state as the hooks last told it."""
    if rs.hooks is None:
        return []
    lab = rs.hooks.labels
    now = time.monotonic()
    out = []
    with lab.lock:
        for rank, info in sorted(rs.ranks.items()):
            st = lab.states.get(rank)
            last = lab.last_step.get(rank)
            inside_s = None
            if st is not None and st.inside_s is not None:
                inside_s = st.inside_s + (now - st.received)
            out.append(
                HangRank(
                    rank=rank,
                    pid=info.pid,
                    host=info.host,
                    steps=lab.steps.get(rank, 0),
                    last_step_age_s=None if last is None else now - last,
                    seq=st.seq if st else None,
                    inside_op=st.inside_op if st else None,
                    inside_seq=st.inside_seq if st else None,
                    inside_s=inside_s,
                    longest_step_s=lab.longest.get(rank),
                    recorder=rs.recorder.get(rank),
                )
            )
    return out


def read_recorder(rs: Any) -> None:
    """The NCCL flight recorder's dumps written since the session began (each rank's
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE prefix, else PyTorch's default)."""
    prefix = (read_environ(rs.primary.pid) or {}).get(PREFIX_ENV) or rs.hang_state.fr_prefix
    rs.hang_state.fr_prefix = prefix
    got = read_dumps(
        prefix, sorted(rs.ranks), since=rs.hang_state.wall_start, owners=rank_owners(rs)
    )
    if got:
        rs.recorder.update(got)


def rank_owners(rs: Any) -> set[int]:
    """The users the ranks run as (their dumps are theirs), and gpudiag's own."""
    owners = {os.geteuid()}
    for info in rs.ranks.values():
        try:
            owners.add(os.stat(f"/proc/{info.pid}").st_uid)
        except (OSError, TypeError):
            continue
    return owners


def recorder_dict(rs: Any) -> dict[str, dict]:
    """The flight recorder's summaries for the report, by rank."""
    return {
        str(k): {
            "last_entered": list(v.last_entered) if v.last_entered else None,
            "last_completed": list(v.last_completed) if v.last_completed else None,
            "pending": v.pending,
            "file": v.source,
        }
        for k, v in sorted(rs.recorder.items())
    }


def recorder_hang(rs: Any, th: Thresholds) -> None:
    """After the run: a hang the live watcher did not report (the job stopped on NCCL's
    watchdog timeout) from the flight recorder's dumps alone, when they show a rank behind."""
    if rs.hang_finding is not None:
        return
    read_recorder(rs)
    ranks = hang_ranks(rs) or [
        HangRank(rank=k, pid=i.pid, host=i.host) for k, i in sorted(rs.ranks.items())
    ]
    ranks = [replace(r, recorder=rs.recorder.get(r.rank)) for r in ranks]
    if not rs.recorder or not any(r.recorder and r.recorder.pending for r in ranks):
        return
    rs.hang_finding = hang_finding(ranks, None, th)
    rs.hang = {"ongoing": False, "detected": time.time(), "flight_recorder": recorder_dict(rs)}


CONFIRM_S = 1.5  # seconds between the look that suspects a hang and the one that confirms it


def _dumped(ranks: list[HangRank]) -> tuple[list[HangRank], dict[str, list[str]], dict[str, str]]:
    """Each rank with its main thread's stack dumped, the stacks and the dumps that failed,
    by rank."""
    dumped = []
    stacks: dict[str, list[str]] = {}
    errors: dict[str, str] = {}
    for r in ranks:
        frames, err = dump_main_stack(r.pid) if r.pid else ((), "no pid")
        if err:
            errors[str(r.rank)] = err
        stacks[str(r.rank)] = list(frames)
        dumped.append(replace(r, stack=frames))
    return dumped, stacks, errors


def _hangs(rs: Any, th: Thresholds, dumped: list[HangRank], quiet: float) -> bool:
    """Whether the quiet job hangs: a rank waits in a collective while the others do not
    evaluate or save, past the threshold, and a second look found the stacks unmoved. Else
    when to look again (and why it is not a hang yet, in the notes)."""
    inside = [
        r
        for r in dumped
        if r.inside_op or stack_collective(r.stack) or (r.recorder and r.recorder.pending)
    ]
    phases = [(r.rank, phase_of(r.stack)) for r in dumped if r not in inside]
    limit, _ = hang_threshold(dumped, th)
    evaluating = bool(inside and phases and all(p for _, p in phases))
    if quiet < limit and (evaluating or not inside):  # too early to say anything of it
        rs.hang_state.recheck_at = time.monotonic() + limit - quiet
        return False
    if evaluating and quiet < limit * th.dist_hang_steps:
        # the ranks outside the collective are evaluating or saving: the others wait for
        # them in a barrier; a hang only past dist_hang_steps times the threshold
        rs.hang_state.recheck_at = time.monotonic() + th.dist_hang_s
        what = "; ".join(f"rank {k} is {p[0]} at {p[1]}" for k, p in phases if p)
        note = (
            f"no step for {quiet:.0f} s, but {what} (the others wait for it): not "
            f"reported as a hang before {limit * th.dist_hang_steps:.0f} s "
            f"(dist_hang_steps x the hang threshold {limit:.0f} s)"
        )
        rs.notes[:] = [n for n in rs.notes if "(the others wait for it)" not in n] + [note]
        return False
    if not inside:
        # a long evaluation or save looks the same: a hang needs a rank left waiting
        # in a collective; look again after another dist_hang_s
        rs.hang_state.recheck_at = time.monotonic() + th.dist_hang_s
        note = (
            f"no step for {quiet:.0f} s on any rank, but no rank was inside a collective: "
            "not reported as a hang (an evaluation or a long save looks the same)"
        )
        if note not in rs.notes[-1:]:
            rs.notes.append(note)
        return False
    # the hooks' step and collective events can lag the job on a busy box (a rank shown
    # inside a barrier it has left): a hang is confirmed by a second look whose stacks have
    # not moved; a job that moves (a step, other frames) was not hung
    # (the first look comes CONFIRM_S before the threshold, so that the hang is named at it)
    seen = {r.rank: user_frames(r.stack) for r in dumped}
    if rs.hang_state.suspect != seen:
        rs.hang_state.suspect = seen
        rs.hang_state.recheck_at = time.monotonic() + max(CONFIRM_S, limit - quiet)
        return False
    if quiet < limit:
        rs.hang_state.recheck_at = time.monotonic() + limit - quiet
        return False
    return True


def check_hang(rs: Any, th: Thresholds) -> None:
    """When no rank stepped for dist_hang_s: dump every rank's stack, build DIST002 and
    call `on_hang` (once per hang; a step on any rank ends it)."""
    ranks = hang_ranks(rs)
    quiet = is_hung(ranks, th, early_s=CONFIRM_S)  # the suspecting look comes that early
    if quiet is None:
        rs.hang_state.suspect = None  # a step: whatever was suspected moved on
        if rs.hang is not None and rs.hang.get("ongoing"):
            rs.hang["ongoing"] = False
        return
    if rs.hang is not None and rs.hang.get("ongoing"):
        return
    if time.monotonic() < rs.hang_state.recheck_at:
        return
    dumped, stacks, errors = _dumped(ranks)
    read_recorder(rs)
    dumped = [replace(r, recorder=rs.recorder.get(r.rank)) for r in dumped]
    if not _hangs(rs, th, dumped, quiet):
        return
    rs.hang_state.suspect = None
    rs.hang_finding = hang_finding(dumped, quiet, th)
    rs.hang = {
        "ongoing": True,
        "detected": time.time(),
        "seconds_without_step": round(quiet, 1),
        "stacks": stacks,
        "stack_errors": errors,
        "collectives": {
            str(r.rank): {"seq": r.seq, "inside": r.inside_op, "inside_seq": r.inside_seq}
            for r in ranks
        },
        "flight_recorder": recorder_dict(rs),
    }
    if rs.on_hang is not None:
        rs.on_hang()
