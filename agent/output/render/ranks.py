"""The text summary's part for a multi-rank job: one row per rank, the straggler marked, and
a hang's stacks side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpudiag.agent.output.report_types import Report

PARTS = ("data", "compute", "copies", "collectives", "checkpoint", "other")


def _pct(v: object) -> str:
    return f"{v:.0%}" if isinstance(v, (int, float)) else "-"


def gpu_rows(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each rank's GPU (NVML): utilisation, SM activity, memory, SM clock, worst throttle."""
    rows = [r for r in ranks if r.get("gpu_stats")]
    if not rows:
        return []
    out = [f"  {'rank':>6} {'gpu':<4} {'util':>5} {'sm':>5} {'mem GiB':>8} {'sm MHz':>11} throttle"]
    for r in rows:
        g = r["gpu_stats"]
        sm = g.get("gpm_sm_active", g.get("job_sm_util"))
        mem = g.get("mem_used_bytes")
        clk = g.get("sm_clock_mhz")
        top = g.get("sm_clock_max_mhz")
        held = {k[9:]: v for k, v in g.items() if k.startswith("throttle_") and v}
        worst = max(held.items(), key=lambda kv: kv[1], default=None)
        clock = f"{clk:.0f}/{top:.0f}" if clk and top else "-"
        out.append(
            f"  {r['rank']:>6} {str(r.get('gpu')):<4} {_pct(g.get('util_gpu')):>5} {_pct(sm):>5} "
            f"{(f'{mem / 2**30:.1f}' if mem else '-'):>8} {clock:>11} "
            + (f"{worst[0]} {worst[1]:.0%}" if worst else "-")
            + (f" ({r.get('gpu_basis')})" if r.get("gpu_basis") else "")
        )
    return out


def rank_lines(doc: Report, width: int = 100) -> list[str]:
    """Rows per rank and the hang's stacks; [] for a single-process report."""
    ranks = doc.get("ranks") or []
    if not ranks:
        return []
    dist = doc.get("distributed") or {}
    strag = (dist.get("straggler") or {}).get("straggler")
    out = [f"Ranks ({len(ranks)}): share of each rank's loop"]
    head = f"  {'rank':>6} {'host':<12} {'gpu':<4} {'step ms':>8} " + " ".join(
        f"{p[:7]:>7}" for p in PARTS
    )
    out.append(head)
    for r in ranks:
        st = r.get("step_time_s")
        bd = r.get("breakdown") or {}
        mark = " <- straggler" if strag is not None and r["rank"] == strag else ""
        out.append(
            f"  {r['rank']:>6} {str(r.get('host') or '-')[:12]:<12} {str(r.get('gpu') or '-'):<4} "
            f"{(f'{st * 1e3:.0f}' if st else '-'):>8} "
            + " ".join(f"{_pct(bd.get(p)) if bd else '-':>7}" for p in PARTS)
            + mark
        )
    out.extend(gpu_rows(ranks))
    reason = (dist.get("straggler") or {}).get("reason")
    if reason:
        out.append(f"  {reason}")
    hang = dist.get("hang")
    if hang and hang.get("stacks"):
        out.append("")
        out.append(
            f"Hang: no step on any rank for {hang.get('seconds_without_step')} s; "
            "each rank's main thread, innermost frame first:"
        )
        cols = sorted(hang["stacks"].items(), key=lambda kv: int(kv[0]))
        colw = max(30, (width - 2) // max(1, len(cols)) - 2)
        coll = hang.get("collectives") or {}

        def title(rank: str) -> str:
            c = coll.get(rank) or {}
            inside = f" in {c['inside']} #{c['inside_seq']}" if c.get("inside") else ""
            seq = f" (last #{c['seq']})" if c.get("seq") is not None else ""
            return f"rank {rank}{inside}{seq}"

        out.append("  " + "  ".join(f"{title(k)[:colw]:<{colw}}" for k, _ in cols))
        depth = max(len(v) for _, v in cols)
        for i in range(min(depth, 12)):
            cells = []
            for _, frames in cols:
                text = frames[i] if i < len(frames) else ""
                fn, _, where = text.partition(" (")
                short = fn + (" (" + where.rsplit("/", 1)[-1] if where else "")
                cells.append(f"{short[:colw]:<{colw}}")
            out.append("  " + "  ".join(cells))
        for k, err in (hang.get("stack_errors") or {}).items():
            out.append(f"  rank {k}: stack not read: {err}")
    out.append("")
    return out
