"""What a session is built from: its options, the probes it runs (made in one place), and
what it returns."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gpudiag.agent.session.budget import default_cpu_budget
from gpudiag.probes.base import Probe, ProbeStatus, Target
from gpudiag.probes.gpu.probe import GpuProbe
from gpudiag.probes.host.probe import HostProbe
from gpudiag.probes.host.process import ProcessProbe
from gpudiag.probes.inprocess.channel import HookProbe
from gpudiag.probes.servers.connections import ConnectionsProbe
from gpudiag.probes.servers.triton import TritonProbe
from gpudiag.probes.stacks.probe import StackConfig, StackProbe


@dataclass
class SessionOptions:
    """How to sample: py-spy rate, window, blocking mode; how long; what to ask the job."""

    duration_s: float | None = None
    rate_hz: int = StackConfig.rate_hz  # the stack probe's own defaults
    window_s: float = StackConfig.window_s
    gil_rate_hz: int = StackConfig.gil_rate_hz
    nonblocking: bool = StackConfig.nonblocking
    progress: bool = True
    skip_steps: int = 0
    # cores gpudiag and its py-spy may use (default: 1.5% of the box); None: no limit
    cpu_budget: float | None = field(default_factory=lambda: default_cpu_budget(os.cpu_count()))
    rss_budget_bytes: int = 150 * 1024 * 1024
    probe_timeout_s: float = 30.0  # a probe call running longer is hung: marked failed
    until_sure: bool = False  # stop once the verdict is sure (checked every SURE_CHECK_S)
    capture_steps: int | None = None  # a profiler capture of N steps, once the job connects
    load_hooks: bool = False  # attach --hooks: load run's hooks into the running job
    attached: bool = False  # attach/watch: the job runs already (no start-up wait for py-spy)
    stacks_min_rate_hz: int | None = None  # the lowest py-spy rate the budget may set
    stacks_pace: bool = False  # below it, rest between windows to keep the CPU goal (watch)


@dataclass(frozen=True)
class Subject:
    """The job a session's report is about, and where the report goes: how the job is
    profiled (`mode`: run, attach), its command, its pid and the report's path."""

    mode: str
    command: list[str]
    pid: int
    out: str


def make_probes(
    opts: SessionOptions, hooks: HookProbe | None = None, ranks: int = 1
) -> list[Probe]:
    """The probes of a session: the host, the process, its stacks, its GPUs and, when given,
    the job's in-process hooks. With `ranks` > 1 the stack rates are split between the ranks
    (each further rank gets its own stack probe, agent.ranks)."""
    stacks = StackProbe(
        StackConfig(
            rate_hz=opts.rate_hz,
            window_s=opts.window_s,
            gil_rate_hz=opts.gil_rate_hz,
            nonblocking=opts.nonblocking,
            pace=opts.stacks_pace,
        )
    )
    if opts.attached:
        stacks.startup_timeout_s = 0.0
    if opts.stacks_min_rate_hz is not None:
        stacks.min_rate_hz = min(stacks.min_rate_hz, opts.stacks_min_rate_hz)
    if ranks > 1:
        stacks.rate_hz = max(5, stacks.rate_hz // ranks)
        stacks.gil_rate_hz = max(2, stacks.gil_rate_hz // ranks) if stacks.gil_rate_hz else 0
    probes: list[Probe] = [
        HostProbe(),
        ProcessProbe(),
        stacks,
        GpuProbe(),
        TritonProbe(),
        ConnectionsProbe(),
    ]
    return probes + ([hooks] if hooks is not None else [])


def open_probe(probe: Probe, target: Target) -> ProbeStatus:
    """Open one probe, an unexpected exception turned into an unavailable status."""
    try:  # (open may take long: py-spy waits for a young interpreter; not timed)
        return probe.open(target)
    except Exception as exc:  # a probe must never take the session down
        return ProbeStatus(probe.name, False, f"failed to start: {exc}")
