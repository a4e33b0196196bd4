"""The report document's types, generated from report.schema.json by
`python scripts/report_types.py` (do not edit): every object a TypedDict (total=False: a
reader still checks what it reads), so the renderers are checked against the schema."""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class ReportTool(TypedDict, total=False):
    """The report's `ReportTool` object."""

    name: Literal["gpudiag"]
    version: str


class ReportRunAgentRatesValue(TypedDict, total=False):
    """The report's `ReportRunAgentRatesValue` object."""

    mean: float
    min: float
    max: float
    last: float


class ReportRunAgent(TypedDict, total=False):
    """The report's `ReportRunAgent` object."""

    cpu_budget_cores: float
    rss_budget_bytes: int
    cpu_cores: float | None
    py_spy_cpu_cores: float | None
    peak_rss_bytes: int | None
    rss_over_budget: bool
    level: float
    adjustments: int
    periods_over_budget: int
    periods: int
    rates: dict[str, ReportRunAgentRatesValue]


class ReportRunProcessesItem(TypedDict, total=False):
    """The report's `ReportRunProcessesItem` object."""

    pid: int
    role: Literal["front end", "model worker", "listener", "helper"]
    what: str


class ReportRun(TypedDict, total=False):
    """The report's `ReportRun` object."""

    mode: Literal["run", "attach", "replay", "demo", "merge"]
    command: list[str] | None
    pid: int | None
    agent: ReportRunAgent
    start: str
    end: str | None
    duration_s: float
    end_reason: Literal[
        "target_exited",
        "duration_reached",
        "interrupted",
        "probe_failed",
        "stopped",
        "replayed",
        "verdict_sure",
    ]
    exit_code: int | None
    settings_source: str | None
    stderr_tail: list[str]
    processes: list[ReportRunProcessesItem]


class ReportWorkload(TypedDict, total=False):
    """The report's `ReportWorkload` object."""

    kind: Literal["training", "inference", "server", "unknown"]
    unit: Literal["step", "batch", "request"]
    basis: str
    evidence: list[str]


class ReportEnvironment(TypedDict, total=False):
    """The report's `ReportEnvironment` object."""

    host: str
    os: str
    cpu_count: int
    cpu_model: str | None
    python: str
    torch: str | None
    driver: str | None
    gpus: list[Any]


class ReportProbesItem(TypedDict, total=False):
    """The report's `ReportProbesItem` object."""

    name: str
    available: bool
    reason: str | None
    hint: str | None
    info: bool


class ReportBreakdown(TypedDict, total=False):
    """The report's `ReportBreakdown` object."""

    shares: dict[str, Any]
    basis: str
    samples: int
    thread: str | None


class ReportFindingsItemEvidenceItem(TypedDict, total=False):
    """The report's `ReportFindingsItemEvidenceItem` object."""

    metric: str
    value: float | None
    unit: str
    threshold: float | None
    comparison: str | None
    setting: str | None
    source: str | None


class ReportFindingsItemRecommendation(TypedDict, total=False):
    """The report's `ReportFindingsItemRecommendation` object."""

    summary: str
    actions: list[str]


class ReportFindingsItemFix(TypedDict, total=False):
    """The report's `ReportFindingsItemFix` object."""

    kind: str
    target: str
    values: dict[str, Any]
    candidate: str


class ReportFindingsItem(TypedDict, total=False):
    """The report's `ReportFindingsItem` object."""

    id: str
    title: str
    severity: Literal["error", "warning", "note"]
    confidence: float
    impact: float
    message: str
    evidence: list[ReportFindingsItemEvidenceItem]
    recommendation: ReportFindingsItemRecommendation
    expected_speedup: float
    location: str | None
    cost: dict[str, Any] | None
    signals: list[str]
    speedup_basis: str
    speedup_kind: Literal["model", "bound", "hypothesis", "floor"]
    speedup_low: float | None
    measured_speedup: float
    fix: ReportFindingsItemFix | None


class ReportTrialsItem(TypedDict, total=False):
    """The report's `ReportTrialsItem` object."""

    finding: str | None
    fix: dict[str, Any]
    predicted: float | None
    predicted_low: float | None
    measured: float | None
    interval: list[float] | None
    rounds: int
    verdict: Literal["held", "missed", "slower", "failed", "refused", "no prediction"]
    reason: str
    change: str | None
    timed_over: str | None
    baseline_steps_per_s: list[float]
    fixed_steps_per_s: list[float]


class ReportVerdict(TypedDict, total=False):
    """The report's `ReportVerdict` object."""

    finding: str | None
    sure: bool
    confidence: float | None
    statement: str


class ReportPhases(TypedDict, total=False):
    """The report's `ReportPhases` object."""

    source: str
    startup_s: float
    loop_s: float
    shutdown_s: float
    startup_share: float
    startup_top: list[dict[str, Any]]


class ReportCriticalPath(TypedDict, total=False):
    """The report's `ReportCriticalPath` object."""

    gpu_idle: float | None
    idle_by_wait: dict[str, Any]
    sync_bubbles: float
    host_bound: float
    unexplained: float
    signals: list[str]


class ReportSeriesPointsItem(TypedDict, total=False):
    """The report's `ReportSeriesPointsItem` object."""

    t_s: float
    dur_s: float
    gpu_util: dict[str, float]
    steps: int
    step_time_s: float | None
    phases: dict[str, float]
    samples: float


class ReportSeries(TypedDict, total=False):
    """The report's `ReportSeries` object."""

    points: list[ReportSeriesPointsItem]
    segment_s: float
    loop_start_s: float | None
    loop_end_s: float | None
    loop_source: str
    thread: str | None


class ReportStacksStacksItem(TypedDict, total=False):
    """The report's `ReportStacksStacksItem` object."""

    frames: list[int]
    count: float
    category: str


class ReportStacks(TypedDict, total=False):
    """The report's `ReportStacks` object."""

    thread: str | None
    samples: float
    frames: list[str]
    stacks: list[ReportStacksStacksItem]


class ReportCaptureStepsItem(TypedDict, total=False):
    """The report's `ReportCaptureStepsItem` object."""

    start_s: float
    dur_s: float
    busy_s: float | None
    idle_s: float | None


class ReportCaptureChecksItem(TypedDict, total=False):
    """The report's `ReportCaptureChecksItem` object."""

    finding: str
    confirms: bool
    statement: str


class ReportCapture(TypedDict, total=False):
    """The report's `ReportCapture` object."""

    device: str
    steps: list[ReportCaptureStepsItem]
    window_s: float
    cost_s: float | None
    top_ops: list[dict[str, Any]]
    top_kernels: list[dict[str, Any]]
    copies: list[dict[str, Any]]
    syncs: list[dict[str, Any]]
    tensor_core_share: float | None
    idle_by_host_s: dict[str, float]
    events: list[dict[str, Any]]
    checks: list[ReportCaptureChecksItem]


class ReportCostPrice(TypedDict, total=False):
    """The report's `ReportCostPrice` object."""

    usd_per_gpu_hour: float
    source: str
    model: str | None
    date: str
    age_days: int
    stale: bool | None
    row: dict[str, Any]


class ReportCostIdle(TypedDict, total=False):
    """The report's `ReportCostIdle` object."""

    usd_per_hour: float
    usd_per_day: float


class ReportCost(TypedDict, total=False):
    """The report's `ReportCost` object."""

    available: bool
    reason: str
    gpu_model: str
    price: ReportCostPrice
    gpus: int
    usd_per_hour: float
    usd_per_day: float
    gpu_idle_share: float
    idle: ReportCostIdle
    usd_per_1000_steps: float | None
    usd_per_million_samples: float | None
    unit: Literal["step", "request", "item", "batch"]
    usd_per_1000_units: float | None
    per_unit_note: str
    if_fixed: dict[str, Any]
    right_sizing: dict[str, Any]
    spot: dict[str, Any]


class ReportComputeAttainable(TypedDict, total=False):
    """The report's `ReportComputeAttainable` object."""

    flops_s: float | None
    bytes_s: float | None
    dtype: str
    source: str


class ReportComputeRowsItemInner(TypedDict, total=False):
    """The report's `ReportComputeRowsItemInner` object."""

    name: str
    bytes: float
    io: float
    flops: float
    own_s: float
    fallback: Literal["sdpa_math", "sdpa_math_dropout"]


class ReportComputeRowsItem(TypedDict, total=False):
    """The report's `ReportComputeRowsItem` object."""

    name: str
    kind: Literal["unit", "own", "outside", "optimizer"]
    share: float
    forward_s: float
    backward_s: float
    flops: float | None
    bytes: float | None
    ops: float | None
    params: float | None
    dtype: str | None
    achieved_flops_s: float | None
    achieved_bytes_s: float | None
    efficiency: float | None
    calls: float
    top_ops: str
    group: dict[str, Any]
    why: dict[str, float]
    inner: ReportComputeRowsItemInner


class ReportCompute(TypedDict, total=False):
    """The report's `ReportCompute` object."""

    model: str
    device: str
    dtype: str
    step_s: float
    timed_steps: int
    counted_steps: int
    bare_step_s: float
    flops_per_step: float
    mfu: float | None
    model_efficiency: float | None
    attainable: ReportComputeAttainable
    rows: list[ReportComputeRowsItem]


class ReportComputeStacksRowsItemSite(TypedDict, total=False):
    """The report's `ReportComputeStacksRowsItemSite` object."""

    file: str
    line: int
    function: str


class ReportComputeStacksRowsItemCallee(TypedDict, total=False):
    """The report's `ReportComputeStacksRowsItemCallee` object."""

    file: str
    line: int
    function: str


class ReportComputeStacksRowsItem(TypedDict, total=False):
    """The report's `ReportComputeStacksRowsItem` object."""

    kind: Literal["call", "own", "backward", "optimizer"]
    share: float
    samples: float
    module: str
    label: str
    site: ReportComputeStacksRowsItemSite | None
    callee: ReportComputeStacksRowsItemCallee | None
    code: str
    call: str


class ReportComputeStacks(TypedDict, total=False):
    """The report's `ReportComputeStacks` object."""

    source: Literal["stacks"]
    time: Literal["cpu", "launch"]
    loop_samples: float
    model_share: float
    note: str
    rows: list[ReportComputeStacksRowsItem]


class ReportRightSizeRowsItem(TypedDict, total=False):
    """The report's `ReportRightSizeRowsItem` object."""

    model: str
    label: str
    measured: bool
    memory_gib: float
    usd_per_gpu_hour: float
    price_source: str
    ratios: dict[str, float]
    relative_speed: float
    relative_speed_band: list[float]
    units_per_s: float | None
    usd_per_1000_units: float | None
    usd_per_1000_units_band: list[float | None] | None


class ReportRightSize(TypedDict, total=False):
    """The report's `ReportRightSize` object."""

    available: bool
    kind: Literal["model"]
    reason: str
    statement: str
    missing: list[str]
    host_share: float
    ceiling: float | None
    current: str
    gpus: int
    unit: Literal["step", "request", "item", "batch"]
    rate_metric: str
    rate: float | None
    peak_vram_gib: float
    need_vram_gib: float
    basis: dict[str, Any]
    rows: list[ReportRightSizeRowsItem]
    same_speed: str | None
    per_unit: str | None
    statements: list[str]
    note: str


class ReportGate(TypedDict, total=False):
    """The report's `ReportGate` object."""

    verdict: Literal["pass", "warn", "fail", "inconclusive"]
    note: str | None
    config: str
    baseline: str
    comparisons: list[dict[str, Any]]


class ReportRanksItem(TypedDict, total=False):
    """The report's `ReportRanksItem` object."""

    rank: int
    local_rank: int | None
    world_size: int | None
    pid: int | None
    host: str | None
    gpu: str | None
    gpu_basis: str | None
    gpu_stats: dict[str, float]
    steps: int | None
    step_time_s: float | None
    breakdown: dict[str, float]
    stack_samples: int | None
    collective_share_hooks: float | None
    ddp: bool
    last_step_t: float | None
    clock_offset_s: float | None
    report: str | None


class ReportDistributed(TypedDict, total=False):
    """The report's `ReportDistributed` object."""

    straggler: dict[str, Any]
    hang: dict[str, Any] | None
    notes: list[str]
    merged_from: list[str]


class ReportErrorsItem(TypedDict, total=False):
    """The report's `ReportErrorsItem` object."""

    source: str
    message: str
    t: str | None


class Report(TypedDict, total=False):
    """The report's `Report` object."""

    schema_version: Literal["1.0"]
    tool: ReportTool
    run: ReportRun
    workload: ReportWorkload
    environment: ReportEnvironment
    probes: list[ReportProbesItem]
    metrics: dict[str, float | None]
    metric_units: dict[str, str]
    breakdown: ReportBreakdown
    findings: list[ReportFindingsItem]
    trials: list[ReportTrialsItem]
    periods: list[dict[str, Any]]
    verdict: ReportVerdict
    phases: ReportPhases
    critical_path: ReportCriticalPath | None
    series: ReportSeries
    stacks: ReportStacks
    capture: ReportCapture
    cost: ReportCost
    compute: ReportCompute
    compute_stacks: ReportComputeStacks
    right_size: ReportRightSize
    gate: ReportGate
    ranks: list[ReportRanksItem]
    distributed: ReportDistributed
    thresholds: dict[str, float]
    errors: list[ReportErrorsItem]


Finding = ReportFindingsItem
Evidence = ReportFindingsItemEvidenceItem
Trial = ReportTrialsItem
Verdict = ReportVerdict
