"""A distributed job's local ranks inside one session: each rank's stacks sampled (the budget's
rates split between them), its samples kept in its own timeline, the ranks compared (DIST001,
DIST003), and a watcher that explains a hang (DIST002) while the job is still hung."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpudiag.agent.session.ranks import hang as rank_hang
from gpudiag.agent.session.ranks.gpus import gpu_stats, rank_device
from gpudiag.agent.session.ranks.launch import flight_recorder_note, primary_of
from gpudiag.analyzers.distributed.compare import (
    RANK_PARTS,
    RankStats,
    rank_parts,
    uses_ddp,
)
from gpudiag.analyzers.distributed.hang import HangRank
from gpudiag.analyzers.distributed.passes import RanksSeen
from gpudiag.analyzers.measures.loop import location_of
from gpudiag.analyzers.model.results import Finding
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.analyzers.timeline.timeline import Timeline
from gpudiag.probes.base import ProbeStatus, Sample, Target
from gpudiag.probes.dist.ranks import RankInfo, find_ranks
from gpudiag.probes.gpu.probe import GpuProbe
from gpudiag.probes.inprocess.channel import HookProbe
from gpudiag.probes.stacks.probe import StackConfig, StackProbe

DISCOVER_S = 60.0  # keep looking for ranks that start late (Lightning spawns after set-up)


class RankStackProbe(StackProbe):
    """The stack probe of one non-primary rank: its samples carry the rank's label."""

    def __init__(self, rank: int, pid: int, config: StackConfig) -> None:
        super().__init__(config)
        self.rank = rank
        self.pid = pid
        self.name = f"stacks-rank{rank}"

    def open(self, target: Target) -> ProbeStatus:
        """Open on this rank's process (the session's target is the primary rank)."""
        return super().open(Target(self.pid))

    def sample(self) -> list[Sample]:
        """The rank's finished windows, as `stacks` samples labelled with the rank."""
        lab = str(self.rank)
        return [
            Sample("stacks", s.t_ns, {**s.labels, "rank": lab}, s.values) for s in super().sample()
        ]


class RankSet:
    """The local ranks of the job a session watches."""

    def __init__(self, ranks: list[RankInfo], primary: RankInfo, hooks: HookProbe | None) -> None:
        self.ranks: dict[int, RankInfo] = {}
        self.primary = primary
        self.hooks = hooks
        self.timelines: dict[int, Timeline] = {}
        self.hang: dict | None = None
        self.hang_finding: Finding | None = None
        self.on_hang: Callable[[], None] | None = None
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self.add_probe: Callable[[RankInfo], None] = lambda info: None
        self.hang_state = rank_hang.HangState()  # the hang watcher's own state
        self.root_pid = primary.pid
        self.recorder: dict = {}  # rank -> RecorderRank, from the flight recorder's dumps
        self.gpu_basis: dict[int, str] = {}  # rank -> how its GPU is known (nvml, env)
        self.gpu_probe: GpuProbe | None = None  # which device each rank's pid is on
        self.main_timeline: Callable[[], Timeline | None] = lambda: None
        for r in ranks:
            self.add(r)
        self.recorder_note = flight_recorder_note(primary.pid)  # read while it runs
        if hooks is not None:
            hooks.labels.enabled = True

    # ---- membership ---------------------------------------------------------------------
    def add(self, info: RankInfo) -> bool:
        """Register a rank (False when known); its hooks' datagrams get its label."""
        if info.rank in self.ranks:
            return False
        self.ranks[info.rank] = info
        self.timelines[info.rank] = Timeline()
        if self.hooks is not None:
            with self.hooks.labels.lock:
                self.hooks.labels.ranks[info.pid] = info.rank
        return True

    def stack_probe(self, info: RankInfo, rate_hz: int, opts: Any) -> RankStackProbe:
        """A stack probe for a non-primary rank, at its share of the rates (the session's
        `opts`: window, blocking, the lowest rate and pacing as the primary's)."""
        config = StackConfig(
            rate_hz=rate_hz,
            window_s=opts.window_s,
            gil_rate_hz=0,
            nonblocking=opts.nonblocking,
            min_rate_hz=min(StackConfig.min_rate_hz, opts.stacks_min_rate_hz or 5),
            pace=opts.stacks_pace,
        )
        return RankStackProbe(info.rank, info.pid, config)

    # ---- samples ------------------------------------------------------------------------
    def route(self, samples: list[Sample]) -> tuple[list[Sample], list[Sample]]:
        """Put each rank's samples into its timeline (rank label dropped). Returns the main
        timeline's samples (unlabelled ones and the primary rank's, unlabelled; what a
        recording keeps) and the other ranks' (labelled)."""
        main: list[Sample] = []
        others: list[Sample] = []
        per: dict[int, list[Sample]] = {}
        primary = self.primary.rank
        for s in samples:
            lab = s.labels.get("rank")
            if lab is None:
                main.append(s)
                if s.probe == "stacks":
                    per.setdefault(primary, []).append(s)
                continue
            bare = Sample(
                s.probe, s.t_ns, {k: v for k, v in s.labels.items() if k != "rank"}, s.values
            )
            rank = int(lab) if lab.isdigit() else -1
            if rank == primary:
                main.append(bare)
            else:
                others.append(s)
            per.setdefault(rank, []).append(bare)
        for rank, items in per.items():
            tl = self.timelines.get(rank)
            if tl is not None:
                tl.extend(items)
        return main, others

    # ---- analysis -----------------------------------------------------------------------
    def stats(self, th: Thresholds, rules: Any = ()) -> list[RankStats]:
        """Each rank's summary from its own timeline."""
        from gpudiag.analyzers import analyze  # the engine loads with the first analysis

        out = []
        devices = dict(getattr(self.gpu_probe, "pid_devices", {}) or {})
        main_tl = self.main_timeline()
        for rank, info in sorted(self.ranks.items()):
            gpu, basis = rank_device(info, devices)
            self.gpu_basis[rank] = basis
            an = analyze(self.timelines[rank], th, rules)
            m = an.metrics
            sps = m.get("steps_per_second")
            coll = self.timelines[rank].rollup("hooks", "collective_s", kind="collective_step")
            steps = self.timelines[rank].rollup("hooks", "step_time_s", kind="step")
            share = None
            both = _paired_share(self.timelines[rank])
            if both is not None:  # collective time and step length from the same rows
                share = both
            elif coll is not None and steps is not None and steps.total > 0:
                share = min(1.0, coll.total / steps.total)
            out.append(
                RankStats(
                    rank=rank,
                    pid=info.pid,
                    host=info.host,
                    gpu=gpu,
                    gpu_stats=gpu_stats(main_tl, gpu),
                    parts=rank_parts(an.breakdown),
                    samples=an.breakdown.samples,
                    steps=int(steps) if (steps := m.get("steps")) is not None else None,
                    step_time_s=1.0 / sps if sps else None,
                    collective_share_hooks=share,
                    locations=_part_locations(an.profile.stacks_by_category),
                    ddp=uses_ddp(an.profile.stacks_by_category),
                    detail=dict(an.breakdown.shares),
                )
            )
        return out

    def section(
        self, th: Thresholds, rules: Any = (), gpus: bool = True
    ) -> tuple[list[Finding], dict]:
        """The DIST findings and the report's `ranks` and `distributed` parts; without
        `gpus` (no GPU seen) the ranks' GPUs are left unknown."""
        stats = self.stats(th, rules)
        if not gpus:
            stats = [replace(s, gpu=None, gpu_stats={}) for s in stats]
        rank_hang.recorder_hang(self, th)
        from gpudiag.analyzers.engine.registry import RANKS

        compared = RANKS.run(RanksSeen(stats, th, self.hang_finding))
        ranks = []
        for s in stats:
            d = self.ranks[s.rank].to_dict()
            d["gpu"] = s.gpu
            if s.gpu is not None:
                d["gpu_basis"] = self.gpu_basis.get(s.rank)
                d["gpu_stats"] = s.gpu_stats
            roll = self.timelines[s.rank].rollup("hooks", "step_time_s", kind="step")
            d["last_step_t"] = roll.last_ns / 1e9 if roll and roll.last_ns else None
            d.update(
                {
                    "steps": s.steps,
                    "step_time_s": s.step_time_s,
                    "breakdown": s.parts if s.samples else {},
                    "stack_samples": s.samples,
                    "collective_share_hooks": s.collective_share_hooks,
                    "ddp": s.ddp,
                }
            )
            ranks.append(d)
        notes = [self.recorder_note, *self.notes]
        if self.hooks is None or not self.hooks.labels.steps:
            notes.append(
                "hangs (DIST002) not watched: no step events from the ranks' in-process hooks "
                "(`gpudiag run` injects them; a job profiled with attach needs instrument())"
            )
        dist = {"straggler": compared.part, "hang": self.hang, "notes": notes}
        return compared.findings, {"ranks": ranks, "distributed": dist}

    # ---- the watcher --------------------------------------------------------------------
    def start(self, th: Thresholds) -> None:
        """Look for late ranks (for DISCOVER_S) and check for a hang every second."""
        add_probe, root_pid = self.add_probe, self.root_pid

        def run() -> None:
            while not self._stop.wait(1.0):
                try:
                    if time.monotonic() - self._started < DISCOVER_S:
                        for info in find_ranks(root_pid):
                            if self.add(info):
                                add_probe(info)
                    self.check_hang(th)
                except Exception as exc:  # the watcher must never take the session down
                    self.notes.append(f"rank watcher: {type(exc).__name__}: {exc}")
                    return

        self._thread = threading.Thread(target=run, name="gpudiag-ranks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watcher."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def hang_ranks(self) -> list[HangRank]:
        """Each rank's progress and collective state as the hooks last told it."""
        return rank_hang.hang_ranks(self)

    def check_hang(self, th: Thresholds) -> None:
        """When no rank stepped for the hang threshold: DIST002 (agent/session/ranks/hang.py)."""
        rank_hang.check_hang(self, th)


def _paired_share(tl: Timeline) -> float | None:
    """Time in collectives / step length, both from the collective hooks' own rows (a lost
    datagram loses both together); None for hooks that do not send the step's length."""
    length = tl.rollup("hooks", "collective_step_s", kind="collective_step")
    coll = tl.rollup("hooks", "collective_s", kind="collective_step")
    if length is None or coll is None or length.total <= 0 or length.count != coll.count:
        return None
    return min(1.0, coll.total / length.total)


def _part_locations(by_cat: dict) -> dict[str, str]:
    """Each rank part's hottest user frame (file:line:function), from the loop's stacks."""
    out: dict[str, str] = {}
    for part, cats in RANK_PARTS.items():
        stacks = sorted((s for c in cats for s in by_cat.get(c, ())), key=lambda s: -s.count)
        loc = location_of(tuple(stacks))
        if loc is not None:
            out[part] = f"{loc.file}:{loc.line}:{loc.function}"
    return out


def setup_ranks(session: Any, ranks: list[RankInfo], root_pid: int) -> RankSet:
    """The ranks a session under construction follows (it calls this): a stack probe per
    non-primary rank (the primary's rates were split between the ranks by make_probes), the
    hooks' datagrams labelled by rank. The session's target is the primary rank."""
    opts = session.opts
    n = max(1, len(ranks))
    hooks = next((p for p in session.probes if isinstance(p, HookProbe)), None)
    primary = next((r for r in ranks if r.pid == session.target.pid), primary_of(ranks))
    rs = RankSet(ranks, primary, hooks)
    for info in ranks:
        if info.pid != session.target.pid:
            session.probes.append(rs.stack_probe(info, max(5, opts.rate_hz // n), opts))
    rs.add_probe = add_rank_probe_fn(session, opts, n)
    rs.root_pid = root_pid
    rs.gpu_probe = next((p for p in session.probes if isinstance(p, GpuProbe)), None)
    if rs.gpu_probe is not None:  # the other ranks are not the primary's children
        rs.gpu_probe.extra_pids |= {r.pid for r in ranks if r.pid}
    rs.main_timeline = lambda: session.timeline
    return rs


def add_rank_probe_fn(session: Any, opts: Any, n: int) -> Callable[[RankInfo], None]:
    """How the watcher adds a late rank's stack probe to a running session."""

    def add(info: RankInfo) -> None:
        if session.ranks.gpu_probe is not None and info.pid:
            session.ranks.gpu_probe.extra_pids.add(info.pid)
        if info.pid == session.target.pid:
            return
        probe = session.ranks.stack_probe(info, max(5, opts.rate_hz // max(1, n)), opts)
        if session.governor is not None:  # its CPU goal and level, as the first probes got
            session.governor.adopt(probe)
        session.probes.append(probe)
        st = probe.open(Target(info.pid))
        session.statuses[probe.name] = st
        if st.available:
            session.start_probe(probe)

    return add
