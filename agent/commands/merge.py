"""`gpudiag merge`: one job report from the reports of its hosts (or of its single ranks).

Each host's gpudiag profiles that host's ranks and writes a report with their `ranks`; the
merged report puts every rank in one view, runs the straggler analysis across hosts, and
aligns the hosts' clocks on the steps: in a synchronous data-parallel job every rank ends step
k at nearly the same moment, so the difference between two hosts' times of the same step is
the difference between their clocks.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from gpudiag.agent.base.config import load_settings
from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.options import FromArgs, settings_options
from gpudiag.agent.output.render.formats import SUMMARIES
from gpudiag.agent.output.report import (
    check_writable,
    iso,
    load_report,
    reading,
    validate,
    write_report,
)
from gpudiag.agent.session.wiring import print_summary
from gpudiag.analyzers.distributed.compare import RankStats
from gpudiag.analyzers.distributed.passes import RanksSeen, ReportsMerged
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.text.sink import emit


def _ranks_of(doc: dict, path: str, fallback: int) -> list[dict]:
    """The report's ranks; a report without them stands for one rank (its main process)."""
    if doc.get("ranks"):
        return [dict(r, report=path) for r in doc["ranks"]]
    m = doc.get("metrics") or {}
    sps = m.get("steps_per_second")
    shares = (doc.get("breakdown") or {}).get("shares") or {}
    from gpudiag.analyzers.distributed.compare import RANK_PARTS

    parts = {p: round(sum(shares.get(c, 0.0) for c in cats), 6) for p, cats in RANK_PARTS.items()}
    return [
        {
            "rank": fallback,
            "local_rank": None,
            "world_size": None,
            "pid": (doc.get("run") or {}).get("pid"),
            "host": (doc.get("environment") or {}).get("host"),
            "gpu": None,
            "steps": int(m["steps"]) if m.get("steps") is not None else None,
            "step_time_s": 1.0 / sps if sps else None,
            "breakdown": parts if (doc.get("breakdown") or {}).get("samples") else {},
            "stack_samples": (doc.get("breakdown") or {}).get("samples") or 0,
            "collective_share_hooks": None,
            "report": path,
        }
    ]


def clock_offsets(ranks: list[dict]) -> dict[str, float]:
    """Each host's clock minus the first host's, from the time of its ranks' last step
    and the step counts (both counted from the job's first step); {} where unknown."""
    per_host: dict[str, dict] = {}
    for r in ranks:
        if r.get("last_step_t") and r.get("steps") and r.get("step_time_s"):
            per_host.setdefault(str(r.get("host")), r)
    hosts = list(per_host)
    if len(hosts) < 2:
        return {}
    ref = per_host[hosts[0]]
    out = {hosts[0]: 0.0}
    for h in hosts[1:]:
        r = per_host[h]
        step = (ref["step_time_s"] + r["step_time_s"]) / 2
        out[h] = round(
            (r["last_step_t"] - ref["last_step_t"]) - (r["steps"] - ref["steps"]) * step, 4
        )
    return out


def _rank_stats(r: dict) -> RankStats:
    """A report's rank, as the straggler analysis reads it."""
    return RankStats(
        rank=r["rank"],
        pid=r.get("pid"),
        host=r.get("host"),
        gpu=r.get("gpu"),
        parts=r.get("breakdown") or {},
        samples=int(r.get("stack_samples") or 0) if r.get("breakdown") else 0,
        steps=r.get("steps"),
        step_time_s=r.get("step_time_s"),
        collective_share_hooks=r.get("collective_share_hooks"),
        ddp=bool(r.get("ddp")),
        gpu_stats={
            k: v
            for k, v in (r.get("gpu_stats") or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        },
    )


def merge_reports(paths: list[str], th: Thresholds | None = None) -> dict:
    """The job report of several per-host reports; UsageError for unusable input."""
    from gpudiag.analyzers.engine.finalize import merged_verdict
    from gpudiag.analyzers.engine.registry import MERGE  # the engine loads when it is used

    th = th or Thresholds()
    if len(paths) < 2:
        raise UsageError("merge needs at least two reports")
    docs = [load_report(p) for p in paths]
    ranks: list[dict] = []
    for i, (doc, path) in enumerate(zip(docs, paths, strict=True)):
        ranks += _ranks_of(doc, path, fallback=i)
    seen: dict[tuple, str] = {}
    for r in ranks:
        key = (r["rank"],)
        if key in seen:
            raise UsageError(
                f"rank {r['rank']} is in both {seen[key]} and {r['report']}: "
                "merge reports of different ranks of one job"
            )
        seen[key] = r["report"]
    ranks.sort(key=lambda r: r["rank"])
    offsets = clock_offsets(ranks)
    for r in ranks:
        r["clock_offset_s"] = offsets.get(str(r.get("host")))
    stats = [_rank_stats(r) for r in ranks]
    hosts = {str(r.get("host")) for r in ranks}
    reports = [
        ((doc.get("environment") or {}).get("host") or path, doc.get("findings") or [])
        for doc, path in zip(docs, paths, strict=True)
    ]
    merged = MERGE.run(ReportsMerged(RanksSeen(stats, th), reports))
    findings, decision = merged.findings, merged.part
    base = dict(docs[0])
    starts = [d["run"]["start"] for d in docs if d["run"].get("start")]
    ends = [d["run"]["end"] for d in docs if d["run"].get("end")]
    hangs = [d.get("distributed", {}).get("hang") for d in docs]
    notes = []
    if offsets:
        notes.append(
            "host clocks aligned on the last step each host saw: "
            + ", ".join(f"{h} {o:+.3f} s" for h, o in offsets.items())
        )
    elif len(hosts) > 1:
        notes.append("host clocks not aligned: the reports have no step times (hooks)")
    base.update(
        {
            "run": dict(
                docs[0]["run"],
                mode="merge",
                command=docs[0]["run"].get("command"),
                start=min(starts) if starts else None,
                end=max(ends) if ends else iso(time.time()),
            ),
            "ranks": ranks,
            "findings": findings,
            "distributed": {
                "straggler": decision,
                "hang": next((h for h in hangs if h), None),
                "notes": notes,
                "merged_from": list(paths),
            },
            "errors": [e for d in docs for e in d.get("errors") or []],
            "verdict": merged_verdict(findings, docs),
        }
    )
    base.pop("gate", None)
    return base


@dataclass(frozen=True)
class MergeOptions(FromArgs):
    """`gpudiag merge`'s options."""

    reports: tuple[str, ...]
    out: str | None = None
    format: str = "text"
    config: str | None = None
    overrides: tuple[str, ...] | None = None


def main(args: MergeOptions) -> int:
    """`gpudiag merge`: one job report from per-host reports; printed, and written with
    --out."""
    overrides = list(args.overrides) if args.overrides is not None else None
    settings = load_settings(args.config, overrides)
    if args.out:
        check_writable(args.out)
    with reading(", ".join(args.reports)):
        doc = merge_reports(list(args.reports), settings.thresholds)
        print_summary(doc, args.format)
    if args.out:
        path = write_report(doc, args.out)
        note = sys.stdout if args.format == "text" else sys.stderr
        emit(f"Job report written to {path}", file=note)
    else:
        validate(doc)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`gpudiag merge A.json B.json ... --out JOB.json`: one job report from per-host ones."""
    p = sub.add_parser(
        "merge",
        help="one job report from the reports of its hosts (or ranks)",
        description="Merge the reports each host's gpudiag wrote for its ranks into one "
        "job report: every rank in one view, the straggler analysis across hosts, the "
        "hosts' clocks aligned on the steps.",
    )
    p.add_argument("reports", nargs="+", metavar="REPORT.json", help="per-host reports")
    p.add_argument("--out", metavar="FILE", help="write the job report here")
    p.add_argument(
        "--format",
        choices=SUMMARIES,
        default="text",
        help="summary on stdout (default: text)",
    )
    settings_options(p, "thresholds from this TOML file")
