"""Profile of the training loop: which thread drives it and where its wall time goes.

This is the shared first step of every host-side analyzer: find the loop thread from its
stacks, classify its samples with the frame rules, split the input-pipeline share into CPU
work and storage reads, and estimate the time it waits for the GIL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudiag.analyzers.measures.rules import (
    WORKER_LOOP_RE,
    Classifier,
    is_model_loading,
    parse_stack,
    user_location,
)
from gpudiag.analyzers.model.results import CATEGORIES, Breakdown, Location
from gpudiag.analyzers.timeline.timeline import Aggregate, ThreadKey

NOT_LOOP = ("other", "startup")
BLOCKING = ("data_wait", "storage_io", "sync", "collective", "checkpoint")
COMPUTE_LIKE = ("forward", "backward", "optimizer", "h2d_copy", "other")


@dataclass(frozen=True)
class StackCount:
    """One stack of a thread, its innermost source line and how often it was sampled."""

    stack: str
    code: str
    count: float


@dataclass(frozen=True)
class LoaderStats:
    """What the input pipeline's loaders did: DataLoader workers, or the loop thread itself."""

    source: str  # "workers" or "loop thread"
    busy_samples: float  # loader samples not waiting on a queue
    io_samples: float  # of those, in storage reads
    io_fraction: float  # io / busy
    top_stacks: tuple[StackCount, ...] = ()
    blocking_fraction: float = 0.0  # of busy, on a line that waits (sleep, socket, request)


@dataclass(frozen=True)
class GilStats:
    """Who held the GIL (py-spy --gil samples) and the loop thread's estimated wait for it."""

    ticks: float
    loop_share: float
    other_share: float
    holders: tuple[tuple[str, float, str], ...]  # (thread, share of ticks, top function)
    loop_off_cpu: float | None
    loop_blocked: float
    wait_share: float
    readings: int = 0  # procfs schedstat readings of the loop thread behind loop_off_cpu
    duration_s: float = 0.0  # span of the --gil recordings
    other_cpu: float | None = None  # cores the job's other Python threads ran (schedstat)

    def independent_ticks(self) -> float:
        """--gil ticks counted as independent: at most one per 100 ms (GIL hand-offs come
        every 5 ms, so ticks closer than that are correlated; slower ones are not)."""
        return min(self.ticks, self.duration_s * 10) if self.duration_s else self.ticks / 10


@dataclass(frozen=True)
class LoopProfile:
    """Everything the host-side analyzers need about the training loop."""

    thread: ThreadKey | None
    samples: float
    category_counts: dict[str, float]
    breakdown: Breakdown
    stacks_by_category: dict[str, tuple[StackCount, ...]] = field(default_factory=dict)
    loader: LoaderStats | None = None
    gil: GilStats | None = None
    loop_cpu: float | None = None
    loop_runqueue: float | None = None
    startup_samples: float = 0.0
    loading_samples: float = 0.0  # loading a model inside the loop (in "other")
    loading_stacks: tuple[StackCount, ...] = ()  # those samples' stacks, most sampled first
    loading_keys: frozenset[tuple[str, str]] = frozenset()  # all their (stack, code)

    def share(self, category: str) -> float:
        """The category's share in the final breakdown."""
        return self.breakdown.get(category)

    def placed(self, clf: Classifier, stack: str, code: str = "") -> str:
        """A loop-thread stack's category as this profile placed it: loading a model inside
        the loop is the loop's "other", not start-up."""
        if (stack, code) in self.loading_keys:
            return "other"
        return clf.category(stack, code)


def _thread_stacks(tl: Aggregate, key: ThreadKey) -> list[StackCount]:
    return [StackCount(s, c, n) for (s, c), n in tl.stacks.get(key, {}).items()]


def find_loop_thread(tl: Aggregate, clf: Classifier) -> ThreadKey | None:
    """The target thread whose stacks are most often inside training-loop work."""
    best: tuple[float, float, ThreadKey] | None = None
    for key in tl.threads("all", "target"):
        total = loop = 0.0
        for (stack, code), n in tl.stacks[key].items():
            total += n
            if clf.category(stack, code) not in NOT_LOOP:
                loop += n
        cand = (loop, 1.0 if key.thread == "MainThread" else 0.0, key)
        if best is None or cand[:2] > best[:2]:
            best = cand
    return best[2] if best else None


def thread_series_mean(tl: Aggregate, name: str, tid: int) -> float | None:
    """Mean of a per-thread procfs series of the target (cpu, runqueue_wait, d_state...)."""
    rolls = tl.matching("process", name, scope="thread", tid=str(tid))
    n = sum(r.count for _, r in rolls)
    return sum(r.total for _, r in rolls) / n if n else None


def thread_series_count(tl: Aggregate, name: str, tid: int) -> int:
    """How many readings a per-thread procfs series of the target has."""
    return int(sum(r.count for _, r in tl.matching("process", name, scope="thread", tid=str(tid))))


# a schedstat reading integrates a thread's run-queue wait over its whole interval: at least as
# informative as stack samples at py-spy's nominal rate over the same time, which the shares'
# confidence counts with their autocorrelation (summary.SAMPLE_CORRELATION)
SCHEDSTAT_SAMPLE_HZ = 100.0


def thread_series_samples(tl: Aggregate, name: str, tid: int) -> float:
    """The time a per-thread procfs series covers, as stack samples at SCHEDSTAT_SAMPLE_HZ
    (each reading stands for its interval: the span of n readings is n gaps, not n-1)."""
    span = 0.0
    for _, r in tl.matching("process", name, scope="thread", tid=str(tid)):
        if r.count > 1 and r.first_ns is not None and r.last_ns is not None:
            span += (r.last_ns - r.first_ns) / 1e9 * r.count / (r.count - 1)
    return span * SCHEDSTAT_SAMPLE_HZ


def _loader_stats(
    tl: Aggregate, clf: Classifier, loop_stacks: list[StackCount], loop_key: ThreadKey
) -> LoaderStats | None:
    worker_stacks: list[StackCount] = []
    for key in tl.threads("all", "worker"):
        worker_stacks.extend(_thread_stacks(tl, key))
    busy = [
        s
        for s in worker_stacks
        if WORKER_LOOP_RE.search(s.stack) and not clf.is_waiting(s.stack, s.code)
    ]
    source = "workers"
    if not busy:
        busy = [
            s
            for s in loop_stacks
            if clf.category(s.stack, s.code) == "data_wait" and not clf.is_waiting(s.stack, s.code)
        ]
        source = "loop thread"
    busy_n = sum(s.count for s in busy)
    if busy_n <= 0:
        return None
    io_n = sum(s.count for s in busy if clf.is_io(s.stack, s.code))
    block_n = sum(s.count for s in busy if clf.is_blocking_call(s.stack, s.code))
    top = tuple(sorted(busy, key=lambda s: -s.count)[:10])
    return LoaderStats(source, busy_n, io_n, io_n / busy_n, top, block_n / busy_n)


def job_cores(tl: Aggregate) -> float | None:
    """The CPU cores the job may use: its affinity and cgroup quota (the process probe), else
    the host's cores."""
    return tl.mean("process", "cpus_allowed", scope="target") or tl.mean("host", "cpu_count")


def job_cores_wanted(tl: Aggregate) -> float:
    """The cores the job's threads want: what they ran and what they waited in the run queue,
    the main process and its workers."""
    return sum(
        tl.mean("process", name, scope=scope) or 0.0
        for name in ("cpu_cores", "runqueue_cores")
        for scope in ("target", "workers")
    )


def runqueue_split(tl: Aggregate, loop_cpu: float | None, rq: float | None) -> tuple[float, float]:
    """The loop thread's run-queue wait split between the job itself and the processes
    outside it: the job's own part is what it would wait with the box to itself, i.e. the
    cores it wants (its threads' CPU and run-queue wait, workers included) beyond the box's.

    Measured: a 2-thread intra-op pool plus the loop on 2 cores wants ~1.9 cores; beside a
    process burning a core its backward ran at a tenth of its speed, and every bit of the
    loop's 50% run-queue wait was the burner's.
    """
    if not rq:
        return 0.0, 0.0
    others = tl.mean("host", "other_cpu_cores", scope="others") or 0.0
    if others <= 0:
        return rq, 0.0
    cores = job_cores(tl)
    want = job_cores_wanted(tl)
    if cores is None or want <= 0:
        return 0.0, rq
    excess = max(0.0, want - cores)  # the job oversubscribes the box on its own
    own = rq * excess / (excess + others)
    return own, rq - own


def _other_python_cpu(tl: Aggregate, loop: ThreadKey) -> tuple[float | None, dict[int, float]]:
    """CPU (cores, from schedstat) of the job's other Python threads (those py-spy saw), and
    each one's: a pure-Python thread on a CPU holds the GIL."""
    per: dict[int, float] = {}
    for key in tl.threads("all", "target") + tl.threads("gil", "target"):
        if key.tid == loop.tid or key.tid in per:
            continue
        cpu = thread_series_mean(tl, "cpu", key.tid)
        if cpu is not None:
            per[key.tid] = cpu
    return (sum(per.values()) if per else None), per


@dataclass(frozen=True)
class LoopTime:
    """The loop thread's time as the GIL check reads it: its shares, its CPU and run-queue
    wait (schedstat), the categories that keep it off the CPU without the GIL, and the share
    it sits idle waiting for work."""

    shares: dict[str, float]
    cpu: float | None
    runqueue: float | None
    blocking: tuple[str, ...]
    idle: float = 0.0


def _gil_holders(
    tl: Aggregate, loop: ThreadKey, ticks: float, per_cpu: dict[int, float]
) -> tuple[list[tuple[str, float, str]], float, float]:
    """The other threads that hold the GIL (name, share, where), largest first, and the
    --gil ticks of the loop thread and of the others."""
    names: dict[int, str] = {}
    for key in tl.threads("all", "target") + tl.threads("gil", "target"):
        names.setdefault(key.tid, key.thread or f"tid {key.tid}")
    holders = []
    loop_n = other_n = 0.0
    for key in tl.threads("gil", "target"):
        stacks = _thread_stacks(tl, key)
        n = sum(s.count for s in stacks)
        if key.tid == loop.tid:
            loop_n += n
            continue
        other_n += n
        top = max(stacks, key=lambda s: s.count) if stacks else None
        where = ""
        if top is not None:
            fr = user_location(top.stack) or (parse_stack(top.stack) or (None,))[-1]
            if fr is not None:
                where = f"{fr.function} ({fr.file}:{fr.line})"
        holders.append((names.get(key.tid, f"tid {key.tid}"), min(1.0, n / ticks), where))
    if not holders:  # no --gil ticks: the threads' CPU names them
        holders = [(names[t], min(1.0, c), "") for t, c in per_cpu.items() if c > 0]
    holders.sort(key=lambda h: -h[1])
    return holders, loop_n, other_n


def _gil_stats(
    tl: Aggregate, loop: ThreadKey, lt: LoopTime, other_min: float = 0.20
) -> GilStats | None:
    w = tl.windows.get("gil")
    ticks = w.ticks if w else 0.0
    other_cpu, per_cpu = _other_python_cpu(tl, loop)
    if ticks <= 0 and not other_cpu:
        return None
    holders, loop_n, other_n = _gil_holders(tl, loop, ticks, per_cpu)
    # Who holds the GIL: py-spy's --gil ticks, and the other Python threads' CPU (schedstat,
    # read every 0.2-1 s whatever py-spy's rate): a pure-Python thread on a CPU holds it.
    # The larger counts: on a busy box a holder is often preempted, and the ticks undercount.
    other = min(1.0, max(other_n / ticks if ticks else 0.0, other_cpu or 0.0))
    blocked = sum(lt.shares.get(c, 0.0) for c in lt.blocking) + lt.idle
    off = None if lt.cpu is None else max(0.0, 1.0 - lt.cpu - (lt.runqueue or 0.0))
    # A thread handed the GIL must then get a CPU: while the job's own threads fill the
    # cores (the GIL holders, the intra-op pool) that wait is run-queue time, not sleep
    # (measured: one metrics thread on 2 idle cores: loop off-CPU 6%, run-queue 40%).
    # Run-queue time is the GIL's for the part the job's own threads cause, not the part
    # other processes do (HOST002).
    own_rq, _ = runqueue_split(tl, lt.cpu, lt.runqueue)
    # Not-running time the blocking work does not explain is the wait for the GIL once other
    # threads are seen holding it (GIL001's finder tests that). Below other_min the others'
    # hold is too small to name: capped by it.
    unexplained = 0.0 if off is None else max(0.0, off + own_rq - blocked)
    wait = unexplained if other >= other_min else min(other, unexplained)
    readings = thread_series_count(tl, "cpu", loop.tid)
    return GilStats(
        ticks,
        min(1.0, loop_n / ticks) if ticks else 0.0,
        other,
        tuple(holders),
        off,
        blocked,
        wait,
        readings,
        w.duration_s if w else 0.0,
        other_cpu,
    )


def profile_loop(
    tl: Aggregate,
    clf: Classifier,
    backward_elsewhere: bool = False,
    gil_other_min: float = 0.20,
    idle_waits: bool = False,
    loads_in_loop: bool = False,
) -> LoopProfile:
    """Find the loop thread and build its time breakdown from the timeline.

    `backward_elsewhere`: the job's backward runs on the autograd engine's device thread (CUDA),
    so the loop thread sleeps through it: that is not a wait for the GIL.
    `idle_waits`: the loop waits for work on a queue or lock when it has none (a server's
    model thread waiting for requests): that time is idle, not a wait for the GIL.
    `loads_in_loop`: the job loads its model again and again inside its loop (per batch, per
    request): that loading is the loop's time ("other"), not start-up's.
    """
    key = find_loop_thread(tl, clf)
    if key is None:
        return LoopProfile(None, 0.0, {}, Breakdown.empty("no stack samples"))
    stacks = _thread_stacks(tl, key)
    counts: dict[str, float] = {}
    by_cat: dict[str, list[StackCount]] = {}
    for s in stacks:
        cat = clf.category(s.stack, s.code)
        counts[cat] = counts.get(cat, 0.0) + s.count
        by_cat.setdefault(cat, []).append(s)
    loads = _loading_to_other(counts, by_cat) if loads_in_loop else []
    loading = sum(s.count for s in loads)
    startup = counts.pop("startup", 0.0)
    total = sum(counts.values())
    loop_cpu = thread_series_mean(tl, "cpu", key.tid)
    loop_rq = thread_series_mean(tl, "runqueue_wait", key.tid)
    if total <= 0:
        # no loop yet (a look that saw only start-up): the GIL can still be judged from the
        # thread's schedstat, since a thread starved of it is starved whatever it runs
        gil = _gil_stats(tl, key, LoopTime({}, loop_cpu, loop_rq, BLOCKING), gil_other_min)
        return LoopProfile(
            key,
            0.0,
            {},
            Breakdown.empty("no stack samples"),
            gil=gil,
            loop_cpu=loop_cpu,
            loop_runqueue=loop_rq,
            startup_samples=startup,
        )
    shares = {c: n / total for c, n in counts.items()}
    loader = _loader_stats(tl, clf, stacks, key)
    if loader is not None and shares.get("data_wait", 0.0) > 0:
        moved = shares["data_wait"] * loader.io_fraction
        shares["data_wait"] -= moved
        shares["storage_io"] = shares.get("storage_io", 0.0) + moved
    # With workers, data_wait is the loop blocked on their queue; without, it is the loop
    # making batches itself: Python work that needs the GIL like any other.
    own_loading = loader is None or loader.source != "workers"
    blocking = tuple(c for c in BLOCKING if not (own_loading and c == "data_wait"))
    if backward_elsewhere:
        blocking += ("backward",)
    compute_like = COMPUTE_LIKE + (("data_wait",) if own_loading else ())
    idle = 0.0
    if idle_waits:
        waiting = (s for s in stacks if clf.category(s.stack, s.code) == "other")
        idle = sum(s.count for s in waiting if clf.is_waiting(s.stack, s.code)) / total
    lt = LoopTime(shares, loop_cpu, loop_rq, blocking, idle)
    gil = _gil_stats(tl, key, lt, gil_other_min)
    if gil is not None and gil.wait_share > 0:
        pool = sum(shares.get(c, 0.0) for c in compute_like)
        take = min(gil.wait_share, pool)
        if pool > 0:
            for c in compute_like:
                if c in shares:
                    shares[c] -= shares[c] / pool * take
            shares["gil_wait"] = take
    shares = {c: max(0.0, shares.get(c, 0.0)) for c in CATEGORIES}
    norm = sum(shares.values()) or 1.0
    shares = {c: v / norm for c, v in shares.items()}
    basis = f"py-spy stack samples of the loop thread {key.thread or ''} (tid {key.tid})".replace(
        "  ", " "
    )
    top = {c: tuple(sorted(v, key=lambda s: -s.count)[:10]) for c, v in by_cat.items()}
    return LoopProfile(
        key,
        total,
        counts,
        Breakdown(shares, basis, int(total), f"{key.thread} (tid {key.tid})"),
        top,
        loader,
        gil,
        loop_cpu,
        loop_rq,
        startup,
        loading,
        tuple(sorted(loads, key=lambda s: -s.count)[:10]),
        frozenset((s.stack, s.code) for s in loads),
    )


def _loading_to_other(
    counts: dict[str, float], by_cat: dict[str, list[StackCount]]
) -> list[StackCount]:
    """Move the loop's own loading of a model to "other": the start-up stacks that load one
    (the rest import modules), the weights files it reads (torch.load, safetensors: in a loop
    found loading its model again, the model's), and what the same loader does around them.
    Returns them."""
    loads = [
        s
        for s in by_cat.get("startup", [])
        if is_model_loading(parse_stack(s.stack), readers=False)
    ]
    loads += [
        s
        for cat in KIN_FROM
        for s in by_cat.get(cat, [])
        if is_model_loading(parse_stack(s.stack), readers=True)
    ]
    loads += _loader_kin(loads, by_cat)
    moved = {id(s) for s in loads}
    for cat in list(by_cat):
        kept = [s for s in by_cat[cat] if id(s) not in moved]
        if len(kept) < len(by_cat[cat]):
            counts[cat] -= sum(s.count for s in by_cat[cat] if id(s) in moved)
            by_cat[cat] = kept
    if loads:
        counts["other"] = counts.get("other", 0.0) + sum(s.count for s in loads)
        by_cat.setdefault("other", []).extend(loads)
    return loads


KIN_FROM = ("other", "checkpoint")  # where a loader's other work is placed (not its imports)
MODEL_RUNS = ("forward", "backward")


def _loader_kin(loads: list[StackCount], by_cat: dict[str, list[StackCount]]) -> list[StackCount]:
    """The rest of the loading: stacks whose innermost own frame is the job's function that
    loads (`def load(): model = Net(); model.load_state_dict(torch.load(f))` builds the model
    and reads its weights file besides the loading call). Where that function also runs the
    model (it is on a forward's stack), only its loading lines count."""
    sites = [user_location(s.stack) for s in loads]
    funcs = {(f.file, f.function) for f in sites if f is not None}
    lines = {(f.file, f.function, f.line) for f in sites if f is not None}
    runs = {
        (f.file, f.function)
        for cat in MODEL_RUNS
        for s in by_cat.get(cat, [])
        for f in parse_stack(s.stack)
        if f.is_user
    }
    out = []
    seen = {id(s) for s in loads}
    for cat in KIN_FROM:
        for s in by_cat.get(cat, []):
            f = user_location(s.stack)
            if f is None or id(s) in seen:
                continue
            key = (f.file, f.function)
            if key in funcs and (key not in runs or (*key, f.line) in lines):
                out.append(s)
    return out


def location_of(stacks: tuple[StackCount, ...]) -> Location | None:
    """The user-code frame of the most sampled stack that has one."""
    for s in stacks:
        fr = user_location(s.stack)
        if fr is not None:
            return Location(fr.file, fr.line, fr.function)
    return None
