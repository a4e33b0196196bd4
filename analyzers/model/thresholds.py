"""Named thresholds every finding tests against; a user overrides them by name."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from gpudiag.analyzers.model.results import Evidence

# Each threshold's unit; one not named here is a share (of time, capacity or spend, 0..1),
# or, when its name ends in `_s`, a duration in seconds.
UNITS: dict[str, str] = {
    "min_loop_samples": "count",
    "stack_floor_samples": "count",
    "gil_min_ticks": "count",
    "host_other_cores_min": "cores",
    "host_min_loop_samples": "count",
    "gil_min_readings": "count",
    "min_free_cores": "cores",
    "max_periods": "count",
    "dist_min_rank_samples": "count",
    "dist_min_rank_steps": "count",
    "dist_hang_steps": "count",
    "job_excess_cores_min": "cores",
    "worker_respawn_min": "count",
    "serve_batch_max": "count",
    "serve_in_flight_min": "requests",
    "serve_min_forwards": "count",
    "pad_min_forwards": "count",
    "bound_max": "factor",
    "comp_ops_min": "count",
    "comp_recompute_ratio": "factor",
}
RANGES = {
    "share": "a share from 0 to 1",
    "seconds": "a duration in seconds, more than 0",
    "count": "a count, a whole number from 0",
    "cores": "a number of CPU cores from 0",
    "requests": "a number of requests from 0",
    "factor": "a speed-up factor, 1 or more",
}


@dataclass(frozen=True)
class Thresholds:
    """Limits the analyzers compare measurements with. Shares are fractions of wall time."""

    min_loop_samples: int = 150
    """Loop stack samples from which every stack-based check is judged; below it (down to
    stack_floor_samples) a check is judged when its share's interval is clear of its
    threshold, and named 'not judged' while the interval still straddles it."""
    stack_floor_samples: int = 30
    """The fewest loop stack samples any stack-based check judges from."""
    stack_rate_min: float = 0.5
    """Share of the py-spy ticks asked for that must be recorded (0.72-0.99 on the kept
    recordings); below it the box starved the sampler: the loop's samples count at that
    share, and the verdict is sure only on enough of them (or on timed steps)."""
    data_wait_warn: float = 0.10
    """DATA001/DATA002: share of loop time spent waiting for batches that raises a warning."""
    data_wait_error: float = 0.40
    """DATA001/DATA002: share that makes it an error."""
    min_free_cores: float = 0.5
    """DATA001: idle CPU cores (host average) below which computing loaders are told to get
    cheaper first (the advice is graded; the id does not change with it)."""
    loader_wait_min: float = 0.5
    """DATA001: loaders' off-CPU share of their loading time (schedstat) from which they wait
    rather than compute, and more workers overlap the waits whatever the idle cores."""
    loader_blocking_min: float = 0.2
    """DATA001 with num_workers=0: share of the loop's loading samples on a line that waits
    (sleep, socket, object store) needed beside loader_wait_min to call the loaders waiting."""
    storage_io_warn: float = 0.10
    """IO001: share of loop time lost to storage reads in the input pipeline."""
    io_dstate_min: float = 0.10
    """IO001: loader threads' share of time in uninterruptible (D) sleep that confirms storage."""
    psi_io_min: float = 0.05
    """IO001: PSI io 'some' share that confirms storage stalls."""
    iowait_min: float = 0.05
    """IO001: host CPU iowait share that confirms storage stalls."""
    gil_wait_warn: float = 0.10
    """GIL001: estimated share of loop time spent waiting for the GIL."""
    gil_other_min: float = 0.20
    """GIL001: share of time other threads of the job must hold the GIL."""
    gil_min_ticks: int = 30
    """GIL001: py-spy --gil ticks that let GIL001 stand without min_loop_samples stack samples."""
    gil_min_readings: int = 3
    """GIL001: schedstat readings of the loop thread (one per 0.2-1 s) beside gil_min_ticks."""
    checkpoint_warn: float = 0.05
    """CKPT001: share of loop time inside synchronous checkpoint saves."""
    checkpoint_error: float = 0.20
    """CKPT001: share that makes it an error."""
    host_bound_warn: float = 0.25
    """HOST001: share of loop time the GPU idles while the loop thread works on the CPU."""
    host_optimizer_min: float = 0.25
    """HOST001: optimizer share of the loop from which a per-parameter optimizer is the fix."""
    host_user_code_warn: float = 0.30
    """HOST001: share of the loop spent in the job's own Python (not the model, not a library)."""
    blocking_call_warn: float = 0.10
    """BLOCK001: share of the loop spent in calls it waits for (network, logging, sleep, a
    subprocess, a file write) that no other cause explains."""
    anomaly_record_warn: float = 0.03
    """DEBUG001: share of the loop's stack samples in autograd anomaly detection's stack
    records (torch.fx.traceback.format_stack under an op) at or above which it is a warning;
    below it, with the hooks' word that the switch is on, a note."""
    unexplained_warn: float = 0.25
    """LOOP001: share of the loop that no frame rule and no other finding explains."""
    unexplained_note: float = 0.15
    """LOOP001 as a note: an unexplained share under `unexplained_warn` still named (a whole-
    model deepcopy each step, 16% of the loop, moved the job x1.2), never a warning."""
    bound_max: float = 20.0
    """Every finding: the most a speed-up bound ("at most", the share removed) may read; a
    higher one rests on a share left after the fix (under 5%) that the stack samples do not
    place reliably, and is held at this figure with its basis saying so."""
    waiting_loop_share: float = 0.95
    """LOOP001 and the verdict: share of the loop's stack samples waiting on another thread
    or process (a lock, queue, event, a Manager's proxy, a sleep between polls) at or above
    which the process profiled only waits: it is never "the loop" (no LOOP001 or BLOCK001,
    no bound from it) and the verdict is not sure (its work runs elsewhere: a server's
    workers)."""
    per_step_call_target: float = 0.02
    """BLOCK001/LOOP001: the share a per-step call should keep when made every N steps (N
    in the fix is chosen to hold it)."""
    host_runqueue_warn: float = 0.30
    """HOST002: share of the loop thread's time runnable but waiting for a CPU (schedstat)."""
    host_min_loop_samples: int = 30
    """HOST002: loop stack samples that identify the loop thread whose run-queue wait counts."""
    host_other_cores_min: float = 0.5
    """HOST002: CPU cores the processes outside the job must use to be named the cause."""
    job_runqueue_warn: float = 0.30
    """HOST003: share of the loop thread's time runnable but waiting for a CPU that the job's
    own threads cause (schedstat; the part other processes cause is HOST002's)."""
    job_excess_cores_min: float = 1.0
    """HOST003: cores the job's threads want (running plus run-queue wait, main process and
    workers) beyond the cores available to it (affinity, cgroup quota)."""
    eval_share_warn: float = 0.20
    """EVAL001: share of a training loop's wall time spent in evaluation (stack samples under
    an evaluate/validate caller)."""
    eval_share_target: float = 0.10
    """EVAL001: share of wall time the advised evaluation interval holds evaluation under."""
    eval_train_min: float = 0.05
    """EVAL001: share of the loop in backward and optimizer that makes the job a training job."""
    worker_respawn_min: int = 2
    """DATA003: generations of DataLoader workers re-created during the look (worker processes
    started, over the most alive at once, less the first generation)."""
    startup_note: float = 0.30
    """START001: share of the run spent before the first step (run mode) for a note."""
    startup_note_min_s: float = 10.0
    """START001: seconds before the first step below which start-up is not worth a note."""
    gpu_idle_warn: float = 0.50
    """GPU001: share of time the job's GPU runs no kernel, with no host-side cause found."""
    launch_util_min: float = 0.80
    """GPU002: NVML utilisation at or above which low SM activity means launch-bound."""
    launch_sm_max: float = 0.30
    """GPU002: GPM SM activity at or below which the GPU is launch-bound."""
    tensor_sm_min: float = 0.50
    """GPU003: SM activity needed before missing tensor-core use matters."""
    tensor_active_max: float = 0.05
    """GPU003: tensor-core activity at or below which matrix work is plain fp32."""
    tensor_dram_ratio_max: float = 0.5
    """GPU003: DRAM bandwidth used per unit of SM activity at or above which the SMs' time is
    memory traffic (elementwise work, reductions), which tensor cores would not speed up."""
    capture_idle_confirm: float = 0.50
    """Capture: a GPU-idle finding is confirmed when the captured steps' GPU idle share is at
    least this share of the GPU idle NVML measured over the loop (refuted below)."""
    capture_tensor_core_min: float = 0.50
    """Capture: share of matrix-kernel time on tensor cores below which GPU003 is confirmed."""
    pcie_saturation: float = 0.70
    """XFER001: host-to-device bytes/s as a share of the link's capacity."""
    pcie_busy_max: float = 0.70
    """XFER001: GPU utilisation below which a busy link is holding the GPU back."""
    h2d_copy_warn: float = 0.10
    """XFER001: share of loop time the stacks show in host-to-device copies."""
    pinned_link_efficiency: float = 0.80
    """XFER001: share of the PCIe link's payload bandwidth that pinned copies reach."""
    power_cap_lowered: float = 0.95
    """THROT001: an enforced power limit below this share of the default is a lowered cap."""
    mem_headroom_max: float = 0.25
    """MEM001: peak VRAM share of capacity at or below which there is room to use."""
    mem_near_limit: float = 0.95
    """MEM002: peak VRAM share of capacity at or above which the job is near OOM."""
    throttle_warn: float = 0.10
    """THROT001: share of time clocks were held back by one throttle reason."""
    gpu_imbalance: float = 0.30
    """GPU004: spread of utilisation between the job's busiest and idlest GPU."""
    sync_warn: float = 0.05
    """SYNC001: share of step time the host spends blocked in host-device syncs (hooks)."""
    cost_idle_warn: float = 0.30
    """COST001: share of the GPU spend that is idle (1 - utilisation of the job's GPUs)."""
    error_impact: float = 0.40
    """Any finding whose impact (share of wall time) reaches this is an error, not a warning."""
    period_s: float = 600.0
    """Periods of the loop analysed on their own (when it is at least two of them long)."""
    max_periods: int = 48
    """At most this many periods: longer runs get longer periods."""
    sure_min_loop_s: float = 10.0
    """--until-sure stops no earlier than this many seconds of loop, so that a cause that
    comes every few seconds (workers re-created each epoch, a save every N steps) is seen."""
    sure_confidence: float = 0.9
    """A verdict whose top finding is at least this likely is stated as sure."""
    min_confidence: float = 0.5
    """Findings less likely than this to be above their threshold (sampling noise) are dropped."""
    dist_min_rank_samples: int = 60
    """DIST001/DIST003: stack samples of a rank's loop needed before its shares are compared."""
    dist_straggler_gap: float = 0.10
    """DIST001: share of the step the other ranks wait in collectives beyond the straggler."""
    dist_comm_warn: float = 0.30
    """DIST003: share of every rank's step spent inside collectives (no straggler)."""
    dist_hang_s: float = 60.0
    """DIST002: seconds without a finished step on any rank that make the job hung."""
    dist_min_rank_steps: int = 10
    """DIST001/DIST003: steps timed by the collective hooks on every rank before the ranks'
    measured waits in collectives decide (else the stacks' shares do)."""
    dist_hang_steps: int = 5
    """DIST002: the hang threshold is at least this many of the job's longest step so far
    (a slow step, an evaluation or a save between steps), never below dist_hang_s."""
    trial_tolerance: float = 0.15
    """try: a prediction held when it lies in the measured 95% interval widened by this share."""
    serve_batch_max: int = 1
    """SERVE001: median batch size per model forward at or below which a server runs one
    request per forward."""
    serve_in_flight_min: float = 1.5
    """SERVE001: requests in flight on average at or above which several could share a
    forward."""
    serve_min_forwards: int = 50
    """SERVE001/INFER001: model forwards timed by the hooks before they are judged."""
    infer_grad_share: float = 0.5
    """INFER001: share of the forwards run with autograd on, in a job that never runs a
    backward."""
    serve_host_warn: float = 0.30
    """SERVE002: share of the request handlers' time on the CPU outside the model
    (tokenizing, JSON, pre- and post-processing)."""
    serve_loop_forward_warn: float = 0.30
    """SERVE004: share of a server's event-loop thread's time in the model's forward at or
    above which the requests wait for each other's forwards (an `async def` endpoint calling
    the model)."""
    infer_gpu_idle_warn: float = 0.50
    """INFER002: share of the time the GPU of a batch-inference loop sits idle (NVML) at or
    above which its batches are too small for it."""
    infer_forward_min: float = 0.50
    """INFER002: share of the loop's time in the model's forwards (the hooks) at or above
    which the GPU's idle is the forwards' own (else the input side leaves it idle)."""
    serve_gpu_idle_warn: float = 0.70
    """SERVE003: share of the time a server's GPU sits idle (NVML utilisation) at or above
    which the GPU it holds is mostly paid for nothing."""
    pad_beyond_warn: float = 0.30
    """INFER003: share of the forwards' tokens that padding each batch only to its longest
    row would remove (rows padded past it: `padding="max_length"`)."""
    pad_share_warn: float = 0.50
    """INFER003: share of the forwards' tokens that are padding (rows of unlike lengths in
    one batch, even padded to the longest: sorting by length removes most of it)."""
    serve_load_warn: float = 0.10
    """SERVE005: share of the request path's busy time spent loading a model or its weights
    (from_pretrained, torch.load, safetensors) at or above which it is loaded per request;
    INFER004: share of a batch-inference loop's time loading a model, again for every batch."""
    serve_new_model_share: float = 0.5
    """SERVE005 and INFER004: with the hooks, share of the forwards run by a top module never
    seen before at or above which a model is built per request or per batch (below: one model,
    loaded lazily)."""
    pad_min_forwards: int = 10
    """INFER003: forwards whose attention masks the hooks counted before the padding is
    judged (a mask on a GPU is counted in one forward of four)."""
    comp_share_warn: float = 0.15
    """COMP001: share of the sampled steps' wall time a module, the model's own code, the
    step's ops outside the model or an optimizer group must take to be named."""
    comp_efficiency_ratio: float = 0.25
    """COMP001: a place is far below its op class when its efficiency (its FLOPs and bytes at
    the attainable rates over its time) is at most this share of the rest of the model's."""
    comp_recompute_ratio: float = 2.6
    """COMP001: backward FLOPs over forward FLOPs of a module above which it recomputes its
    forward in the backward (a backward's own work is 2x its forward's)."""
    comp_ops_min: int = 200
    """COMP001: ops a step from which a place's op count is read as a loop over items (with
    its ops at least 10x the model's other units' median)."""
    comp_verdict_efficiency: float = 0.25
    """A sure "no bottleneck" needs the model's compute (the compute table's
    model_efficiency, its time counted on the CPU: the loop thread's run-queue wait taken out)
    at this share or more of what the device attains for the job's shapes, where the hooks
    measured it against a calibration (a CPU); below it, the verdict is not sure and says so."""

    @classmethod
    def names(cls) -> dict[str, str]:
        """Each setting's name and its documentation (the docstring under it)."""
        import ast
        import inspect
        import textwrap

        src = textwrap.dedent(inspect.getsource(cls))
        docs: dict[str, str] = {}
        node = ast.parse(src).body[0]
        assert isinstance(node, ast.ClassDef)
        body = node.body
        for prev, node in zip(body, body[1:], strict=False):
            if (
                isinstance(prev, ast.AnnAssign)
                and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
            ):
                docs[prev.target.id] = str(node.value.value)
        return {f.name: docs.get(f.name, "") for f in fields(cls)}

    @staticmethod
    def unit(name: str) -> str:
        """share, seconds, count, cores, requests or factor."""
        return UNITS.get(name, "seconds" if name.endswith("_s") else "share")

    @classmethod
    def parse(cls, name: str, raw: object) -> float:
        """A value for setting `name`, checked against its unit's range; ValueError if not."""
        unit = cls.unit(name)
        what = f"threshold {name} must be {RANGES[unit]}"
        try:
            if isinstance(raw, bool):
                raise ValueError
            value = float(raw)  # type: ignore[arg-type]  # any object: TypeError caught below
        except (TypeError, ValueError):
            raise ValueError(
                f"threshold {name} needs a number ({RANGES[unit]}), got {raw!r}"
            ) from None
        ok = (
            math.isfinite(value)
            and {
                "share": 0 <= value <= 1,
                "seconds": value > 0,
                "count": value >= 0 and value.is_integer(),
                "cores": value >= 0,
                "requests": value >= 0,
                "factor": value >= 1,
            }[unit]
        )
        if not ok:
            raise ValueError(f"{what}, got {raw!r}")
        return int(value) if unit == "count" else value

    def evidence(
        self,
        setting: str,
        metric: str,
        value: float | None,
        unit: str,
        comparison: str,
        source: str | None = None,
    ) -> Evidence:
        """A measured fact tested against the threshold named `setting` (its value read from
        here, so the name is written once)."""
        return Evidence(metric, value, unit, getattr(self, setting), comparison, setting, source)

    def with_overrides(self, overrides: dict[str, object]) -> Thresholds:
        """A copy with the given settings changed; ValueError on unknown names or values out
        of their unit's range."""
        known = {f.name for f in fields(self)}
        changes: dict[str, Any] = {}
        for name, raw in overrides.items():
            if name not in known:
                raise ValueError(f"unknown threshold {name!r} (see `gpudiag thresholds`)")
            changes[name] = self.parse(name, raw)
        return replace(self, **changes)

    def to_dict(self) -> dict[str, float]:
        """All settings with their values."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
