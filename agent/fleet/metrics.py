"""Findings as Prometheus metrics: a prometheus_client Collector that reads the live analysis of
every watched job at scrape time.

Per job (labelled with its stable identity, agent/fleet/identity.py, and a `job` label that stays
the same when the job restarts): each finding's impact, expected speed-up and money per hour,
the loop's breakdown shares, steps per second, the GPU idle share and the probes' status; the
job's pid and command in `gpudiag_job_info` (join on `job`); per GPU the fields dcgm-exporter
users know, under its label names (`gpu`, `UUID`, `modelName`, `Hostname`, `device`) so that
both join in one query; and gpudiag's own cost. No label takes a step number, a path or free
text; counters end in `_total`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psutil
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpudiag.agent.fleet.identity import LABELS as IDENTITY
from gpudiag.agent.fleet.identity import hostname
from gpudiag.analyzers.model.catalogue import category
from gpudiag.probes.base import Sample
from gpudiag.probes.files import descendants
from gpudiag.probes.host.discovery import cpu_s
from gpudiag.probes.inprocess.channel import LOADED
from gpudiag.text.formatting import LABELS as CATEGORY_WORDS
from gpudiag.text.formatting import is_bound

PREFIX = "gpudiag"
MAX_SERIES_PER_SCRAPE = 2000  # of the jobs' series in one scrape; a job past it is left out
MAX_SCRAPE_LABEL_BYTES = 512 * 1024  # of their label values, together
PER_RUN = ("pid", "command")  # change at every restart: only in gpudiag_job_info
LABELS = ("job", *(k for k in IDENTITY if k not in PER_RUN))
FINDING_LABELS = (*LABELS, "finding", "severity", "category")
GPU_LABELS = (*LABELS, "gpu", "UUID", "modelName", "device")
COUNTERS = {"ecc_uncorrected"}  # GPU fields that only grow: typed counter, named _total
FINDING_CATEGORY_HELP = (
    "category: host (the CPU side of the loop: data loading, Python, GIL, checkpoints), "
    "gpu (the device: idle, throttled, memory, precision), transfer (host-device copies), "
    "distributed (ranks and collectives), cost (money), run (start-up, the run as a whole)"
)
LOOP_CATEGORY_HELP = "category: " + ", ".join(f"{c} ({w})" for c, w in CATEGORY_WORDS.items())
# GPU probe field -> (metric name, help naming the dcgm-exporter field it matches)
GPU_FIELDS: dict[str, tuple[str, str]] = {
    "util_gpu": ("gpu_utilization_ratio", "a kernel ran (DCGM_FI_DEV_GPU_UTIL/100)"),
    "util_mem": ("gpu_mem_copy_utilization_ratio", "memory busy (DCGM_FI_DEV_MEM_COPY_UTIL/100)"),
    "mem_used_bytes": ("gpu_fb_used_bytes", "framebuffer used (DCGM_FI_DEV_FB_USED, bytes)"),
    "mem_total_bytes": ("gpu_fb_total_bytes", "framebuffer size (DCGM_FI_DEV_FB_TOTAL, bytes)"),
    "job_mem_bytes": ("gpu_job_memory_bytes", "device memory held by this job's processes"),
    "sm_clock_mhz": ("gpu_sm_clock_mhz", "SM clock (DCGM_FI_DEV_SM_CLOCK)"),
    "mem_clock_mhz": ("gpu_mem_clock_mhz", "memory clock (DCGM_FI_DEV_MEM_CLOCK)"),
    "temperature_c": ("gpu_temperature_celsius", "GPU temperature (DCGM_FI_DEV_GPU_TEMP)"),
    "power_w": ("gpu_power_usage_watts", "power draw (DCGM_FI_DEV_POWER_USAGE)"),
    "pcie_tx_bytes_per_s": (
        "gpu_pcie_tx_bytes_per_second",
        "PCIe sent (DCGM_FI_PROF_PCIE_TX_BYTES)",
    ),
    "pcie_rx_bytes_per_s": ("gpu_pcie_rx_bytes_per_second", "PCIe in (DCGM_FI_PROF_PCIE_RX_BYTES)"),
    "gpm_sm_active": ("gpu_sm_active_ratio", "SMs busy, GPM (DCGM_FI_PROF_SM_ACTIVE)"),
    "gpm_sm_occupancy": ("gpu_sm_occupancy_ratio", "occupancy (DCGM_FI_PROF_SM_OCCUPANCY)"),
    "gpm_tensor_active": ("gpu_tensor_active_ratio", "(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)"),
    "gpm_dram_bw": ("gpu_dram_active_ratio", "DRAM busy, GPM (DCGM_FI_PROF_DRAM_ACTIVE)"),
    "ecc_uncorrected": (
        "gpu_ecc_uncorrected_errors",
        "uncorrected ECC errors since the driver loaded (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL)",
    ),
}


class LiveJob:
    """One profiled job as the endpoint sees it: its labels, its report so far (analysed at
    most every `refresh_s`) and the latest GPU samples (fed by `tap`, the session's sink)."""

    def __init__(
        self,
        labels: dict[str, str],
        report: Callable[[], dict],
        refresh_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity = {k: labels.get(k, "") for k in IDENTITY}
        self.labels = {**self.identity, "job": job_label(self.identity)}
        self._report = report
        self.refresh_s = refresh_s
        self._clock = clock
        self._doc: dict | None = None
        self._at = float("-inf")
        self._settled = False
        self._lock = threading.Lock()
        self.gpus: dict[str, Sample] = {}

    def tap(self, samples: list[Sample]) -> None:
        """Keep the latest sample of each GPU (to chain into the session's sink)."""
        for s in samples:
            if s.probe == "gpu" and "gpu" in s.labels:
                self.gpus[s.labels["gpu"]] = s

    def doc(self) -> dict:
        """The job's report so far; analysed again when the last one is `refresh_s` old (once
        settled, its final report)."""
        with self._lock:
            now = self._clock()
            if self._settled:
                assert self._doc is not None
                return self._doc
            if self._doc is None or now - self._at >= self.refresh_s:
                self._doc = self._report()
                self._at = now
            return self._doc

    def settle(self, doc: dict) -> None:
        """The job's final report: every later read gives it (the last export carries the
        report's numbers, and nothing is analysed again once the session has ended)."""
        with self._lock:
            self._doc, self._at, self._settled = doc, self._clock(), True

    @property
    def last_doc(self) -> dict | None:
        """The report the last scrape was made from (None before the first)."""
        return self._doc


def chain_sinks(*sinks: Callable[[list[Sample]], None] | None) -> Callable[[list[Sample]], None]:
    """One sink that feeds each of `sinks` (None entries are skipped)."""
    live = [s for s in sinks if s is not None]

    def sink(samples: list[Sample]) -> None:
        for s in live:
            s(samples)

    return sink


def job_label(ident: dict[str, str]) -> str:
    """A job's name that stays when it restarts (pid and container id change): its pod, its
    Slurm job, else its user, host and a short hash of its command."""
    if ident.get("pod"):
        return f"{ident.get('namespace') or 'default'}/{ident['pod']}"
    if ident.get("slurm_job_id"):
        step = ident.get("slurm_step_id")
        return f"slurm/{ident['slurm_job_id']}" + (f".{step}" if step else "")
    digest = hashlib.sha1(ident.get("command", "").encode()).hexdigest()[:10]
    return f"{ident.get('user') or '?'}@{ident.get('Hostname') or hostname()}/{digest}"


def _gauge(name: str, doc: str, labels: Iterable[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


def _gpu_family(key: str) -> GaugeMetricFamily | CounterMetricFamily:
    name, doc = GPU_FIELDS[key]
    if key in COUNTERS:  # exposed as <name>_total
        return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=list(GPU_LABELS))
    return _gauge(name, doc, GPU_LABELS)


class GpudiagCollector(Collector):
    """Reads the jobs' live analyses at scrape time (a custom Collector: no hand-written text)."""

    def __init__(
        self,
        jobs: Callable[[], list[LiveJob]],
        health: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.jobs = jobs
        self.health = health or (lambda: {})

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not analyse anything."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every metric family, from each job's report so far."""
        fam: dict[str, Any] = {  # gauges, and the info family (add_metric of a dict)
            "impact": _gauge(
                "finding_impact_ratio",
                f"share of wall time the finding costs; {FINDING_CATEGORY_HELP}",
                FINDING_LABELS,
            ),
            "speedup": _gauge(
                "finding_expected_speedup_ratio",
                "the job's speed after the finding's fix, as a multiple of now (kind: model, "
                "what the fix should give; bound, the most any fix could give)",
                (*FINDING_LABELS, "kind"),
            ),
            "usd": _gauge(
                "finding_idle_gpu_usd_per_hour",
                "money per hour of GPU time the finding leaves idle (when a price is known)",
                FINDING_LABELS,
            ),
            "top": _gauge(
                "top_finding_impact_ratio",
                "the job's top finding (warning or error), by impact; absent when healthy",
                (*LABELS, "finding", "title"),
            ),
            "share": _gauge(
                "loop_share_ratio",
                f"share of the loop's wall time per breakdown category; {LOOP_CATEGORY_HELP}",
                (*LABELS, "category"),
            ),
            "steps": _gauge("steps_per_second", "training steps per second", LABELS),
            "idle": _gauge("gpu_idle_ratio", "share of the loop the job's GPU sat idle", LABELS),
            "usd_idle": _gauge(
                "idle_gpu_usd_per_hour", "money per hour spent on the job's idle GPU time", LABELS
            ),
            "unit_usd": _gauge(
                "usd_per_1000_units",
                "money per 1,000 units of work (unit: step, request, item or batch) at the "
                "report's price",
                (*LABELS, "unit"),
            ),
            "rs_speed": _gauge(
                "right_size_relative_speed_ratio",
                "the job's speed on a reference GPU model as a multiple of now (basis: measured "
                "for the GPU it runs on, model for the others: a projection from its bound)",
                (*LABELS, "gpu_model", "basis"),
            ),
            "rs_usd": _gauge(
                "right_size_usd_per_1000_units",
                "money per 1,000 units of work on a reference GPU model (basis: measured or model)",
                (*LABELS, "gpu_model", "unit", "basis"),
            ),
            "dur": _gauge("job_profiled_seconds", "how long the job has been profiled", LABELS),
            "probe": _gauge(
                "probe_up", "1 when the probe runs for the job, 0 if not", (*LABELS, "probe")
            ),
            "cpu": _gauge(
                "agent_cpu_cores", "gpudiag's CPU for the job, py-spy included (cores)", LABELS
            ),
            "budget": _gauge("agent_cpu_budget_cores", "the job's share of the CPU budget", LABELS),
            "rss": _gauge("agent_peak_rss_bytes", "gpudiag's peak resident memory", LABELS),
            "stacks_sampled_ratio": _gauge(
                "stacks_sampled_ratio",
                "share of the time the job's stacks are recorded: 1 at the probe's rates; below "
                "1 when py-spy at its lowest rate costs more than the job's share of the CPU "
                "budget and rests between windows; 0 when stopped (see the stacks probe status)",
                LABELS,
            ),
            "threads_read": _gauge(
                "threads_read_per_tick",
                "threads of the job's process read at each tick: stacks, every one (py-spy; "
                "its cost per tick grows with them); process, at most its budget (256 times "
                "the square root of the job's rate level, 16 at least: past it the main "
                "thread and the busy ones every tick, the idle rest in turn)",
                (*LABELS, "probe"),
            ),
            "gpu_info": _gauge(
                "job_gpu_info", "1 for each GPU the job is sampled on (join on UUID)", GPU_LABELS
            ),
            "info": InfoMetricFamily(
                f"{PREFIX}_job",
                "the job's current process and command (they change when it restarts; the "
                "other metrics carry `job` only: join on it)",
                labels=["job", "Hostname"],
            ),
        }
        gpu_fams = {k: _gpu_family(k) for k in GPU_FIELDS}
        host = hostname()
        budget = _SeriesBudget([*fam.values(), *gpu_fams.values()])
        names: set[str] = set()
        for job in self.jobs():
            try:
                doc = job.doc()
            except Exception:  # a job that ended between listing and reading
                continue
            labels = _distinct(job, names)
            self._job(job, doc, fam, labels)
            self._gpus(job, labels, host, fam, gpu_fams)
            if not budget.keep():
                names.discard(labels["job"])
        yield from fam.values()
        yield from gpu_fams.values()
        left = GaugeMetricFamily(
            f"{PREFIX}_scrape_jobs_left_out",
            f"jobs whose series this scrape left out: the scrape holds at most "
            f"{MAX_SERIES_PER_SCRAPE} series and {MAX_SCRAPE_LABEL_BYTES} bytes of labels",
            labels=["Hostname"],
        )
        left.add_metric([host], float(budget.left_out))
        yield left
        yield from own_cost(host)
        h = self.health()
        for name, (value, doc) in sorted(h.items()):
            gauge = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["Hostname"])
            gauge.add_metric([host], float(value))
            yield gauge

    @staticmethod
    def _gpus(
        job: LiveJob, labels: dict[str, str], host: str, fam: dict[str, Any], gpu_fams: dict
    ) -> None:
        for s in list(job.gpus.values()):
            g = [
                s.labels.get("gpu", ""),
                s.labels.get("uuid", ""),
                s.labels.get("name", ""),
                f"nvidia{s.labels.get('gpu', '')}",
            ]
            lv = [labels[k] for k in LABELS] + g
            lv[LABELS.index("Hostname")] = labels["Hostname"] or host
            fam["gpu_info"].add_metric(lv, 1.0)
            for k in GPU_FIELDS:
                v = s.values.get(k)
                if v is not None:
                    gpu_fams[k].add_metric(lv, float(v))

    @staticmethod
    def _job(job: LiveJob, doc: dict, fam: dict[str, Any], labels: dict[str, str]) -> None:
        lv = [labels[k] for k in LABELS]
        fam["info"].add_metric(
            [labels["job"], labels["Hostname"]],
            {"pid": job.identity["pid"], "command": job.identity["command"]},
        )
        _findings(doc, lv, fam)
        bd = doc.get("breakdown") or {}
        for cat, share in (bd.get("shares") or {}).items():
            if share is not None:
                fam["share"].add_metric([*lv, cat], float(share))
        sps = (doc.get("metrics") or {}).get("steps_per_second")
        if sps is not None:
            fam["steps"].add_metric(lv, float(sps))
        idle = gpu_idle(doc)
        if idle is not None:
            fam["idle"].add_metric(lv, idle)
        _money(doc, lv, fam)
        run = doc.get("run") or {}
        fam["dur"].add_metric(lv, float(run.get("duration_s") or 0.0))
        for p in doc.get("probes", []):
            fam["probe"].add_metric([*lv, p["name"]], 1.0 if probe_up(p, doc) else 0.0)
        _agent_cost(run.get("agent") or {}, lv, fam)


def _distinct(job: LiveJob, names: set[str]) -> dict[str, str]:
    """The job's labels, its `job` label made distinct from the jobs' before it in this
    scrape (two processes of one Slurm job or pod): the command's hash added, then the pid."""
    labels = dict(job.labels)
    name = labels["job"]
    if name in names:
        digest = hashlib.sha1(job.identity.get("command", "").encode()).hexdigest()[:10]
        name = f"{labels['job']}/{digest}"
        if name in names:
            name = f"{name}/{job.identity.get('pid', '')}"
    names.add(name)
    labels["job"] = name
    return labels


class _SeriesBudget:
    """Holds a scrape to MAX_SERIES_PER_SCRAPE series and MAX_SCRAPE_LABEL_BYTES of label
    values: a job whose series would pass either is taken out again, whole."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families
        self.marks = [0] * len(families)
        self.series = self.label_bytes = self.left_out = 0

    def keep(self) -> bool:
        """Whether the series added since the last call fit (else they are removed)."""
        added = [f.samples[m:] for f, m in zip(self.families, self.marks, strict=True)]
        n = sum(len(a) for a in added)
        size = sum(len(str(v)) for a in added for s in a for v in s.labels.values())
        if (
            self.series + n > MAX_SERIES_PER_SCRAPE
            or self.label_bytes + size > MAX_SCRAPE_LABEL_BYTES
        ):
            for f, m in zip(self.families, self.marks, strict=True):
                del f.samples[m:]
            self.left_out += 1
            return False
        self.series += n
        self.label_bytes += size
        self.marks = [len(f.samples) for f in self.families]
        return True


def _findings(doc: dict, lv: list[str], fam: dict[str, Any]) -> None:
    """Each finding's impact, speed-up and money, and the top one."""
    from gpudiag.analyzers.engine.catalogue_doc import catalogue

    catalogue()  # every finding unit's spec registered (no analysis may have run here)

    top = None
    for f in doc.get("findings", []):
        fl = [*lv, f["id"], f["severity"], category(f["id"])]
        fam["impact"].add_metric(fl, float(f["impact"]))
        kind = "bound" if is_bound(f) else "model"
        fam["speedup"].add_metric([*fl, kind], float(f["expected_speedup"]))
        usd = (f.get("cost") or {}).get("usd_per_hour")
        if usd is not None:
            fam["usd"].add_metric(fl, float(usd))
        if top is None and f["severity"] in ("error", "warning"):
            top = f
    if top is not None:
        fam["top"].add_metric([*lv, top["id"], top["title"]], float(top["impact"]))


def _agent_cost(agent: dict, lv: list[str], fam: dict[str, Any]) -> None:
    """gpudiag's own cost on the job: its CPU, its CPU budget and its peak memory."""
    if agent.get("cpu_cores") is not None:
        fam["cpu"].add_metric(lv, float(agent["cpu_cores"]))
    if agent.get("cpu_budget_cores") is not None:
        fam["budget"].add_metric(lv, float(agent["cpu_budget_cores"]))
    if agent.get("peak_rss_bytes") is not None:
        fam["rss"].add_metric(lv, float(agent["peak_rss_bytes"]))
    rates = agent.get("rates") or {}
    sampled = (rates.get("stacks_sampled_ratio") or {}).get("last")  # watch: stacks paced
    if isinstance(sampled, (int, float)):
        fam["stacks_sampled_ratio"].add_metric(lv, float(sampled))
    for probe, key in (("stacks", "stacks_threads"), ("process", "process_threads_per_tick")):
        last = (rates.get(key) or {}).get("last")
        if isinstance(last, (int, float)):
            fam["threads_read"].add_metric([*lv, probe], float(last))


def _money(doc: dict, lv: list[str], fam: dict[str, Any]) -> None:
    """Idle spend, cost per 1,000 units of work, and the right-size rows (a model)."""
    cost = doc.get("cost") or {}
    if cost.get("available"):
        fam["usd_idle"].add_metric(lv, float(cost["idle"]["usd_per_hour"]))
        if cost.get("usd_per_1000_units") is not None:
            unit = str(cost.get("unit") or "step")
            fam["unit_usd"].add_metric([*lv, unit], float(cost["usd_per_1000_units"]))
    rs = doc.get("right_size") or {}
    for r in rs.get("rows") or [] if rs.get("available") else []:
        basis = "measured" if r["measured"] else "model"
        fam["rs_speed"].add_metric([*lv, r["model"], basis], float(r["relative_speed"]))
        if r.get("usd_per_1000_units") is not None:
            row = [*lv, r["model"], rs["unit"], basis]
            fam["rs_usd"].add_metric(row, float(r["usd_per_1000_units"]))


def probe_up(probe: dict, doc: dict) -> bool:
    """Whether a probe gives the job's data: available, not an information-only line (the
    hooks of a job that never connected); the hooks only once they timed steps (so
    `steps_per_second` is there whenever they read up)."""
    loaded = str(probe.get("reason") or "").startswith(LOADED)  # attach --hooks: info, up
    if not probe.get("available") or (probe.get("info") and not loaded):
        return False
    if probe.get("name") == "hooks":
        return (doc.get("metrics") or {}).get("steps_per_second") is not None
    return True


def gpu_idle(doc: dict) -> float | None:
    """The job's GPU idle share in a report: the critical path's, else the cost section's."""
    cp = doc.get("critical_path") or {}
    if cp.get("gpu_idle") is not None:
        return float(cp["gpu_idle"])
    cost = doc.get("cost") or {}
    if cost.get("gpu_idle_share") is not None:
        return float(cost["gpu_idle_share"])
    return None


def tree_cost(rss: bool = True) -> tuple[float, int]:
    """gpudiag's CPU seconds, with every child it ran (live, and ended and reaped: each py-spy
    recorder and dump), and its resident bytes with its live children's (0 without `rss`)."""
    me = psutil.Process()
    t = me.cpu_times()
    cpu = t.user + t.system + t.children_user + t.children_system
    mem = me.memory_info().rss if rss else 0
    for pid in descendants(me.pid):
        cpu += max(0.0, cpu_s(pid))  # -1: it ended meanwhile (then reaped: counted above)
        if rss:
            try:
                mem += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                pass
    return cpu, mem


def tree_cpu_s() -> float:
    """gpudiag's CPU seconds with every child it ran, live or ended (as /metrics counts)."""
    return tree_cost(rss=False)[0]


def own_cost(host: str) -> list[Metric]:
    """gpudiag's CPU seconds and resident memory, its py-spy recorders included (the process
    collector's `gpudiag_process_*` count gpudiag's process alone and carry no Hostname)."""
    cpu, rss = tree_cost()
    c = CounterMetricFamily(
        f"{PREFIX}_cpu_seconds", "CPU of gpudiag and its py-spy recorders", labels=["Hostname"]
    )
    c.add_metric([host], cpu)
    m = GaugeMetricFamily(
        f"{PREFIX}_resident_memory_bytes",
        "resident memory of gpudiag and its live py-spy recorders",
        labels=["Hostname"],
    )
    m.add_metric([host], float(rss))
    return [c, m]
