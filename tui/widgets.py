"""Widgets of the diagnosis view: the time breakdown bar, the findings table, panels."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.text import Text
from textual.widgets import DataTable, Static

from gpudiag.text.formatting import SHORT_LABELS, period_parts, speedup_text
from gpudiag.text.redact import printable
from gpudiag.tui.wrap import Wrapped

_STYLES = {
    "data_wait": "red",
    "storage_io": "magenta",
    "h2d_copy": "yellow",
    "forward": "green",
    "backward": "cyan",
    "optimizer": "blue",
    "sync": "bright_red",
    "checkpoint": "bright_magenta",
    "collective": "bright_blue",
    "gil_wait": "bright_yellow",
    "other": "grey50",
}
# (label, colour) per breakdown category; the labels are the summaries' short ones
CATEGORY_STYLE = {c: (SHORT_LABELS[c], style) for c, style in _STYLES.items()}


class BreakdownBar(Static):
    """Where each second of the loop goes, as one stacked bar and a legend."""

    def show(self, breakdown: dict | None, width: int = 60) -> None:
        text = Text()
        if not breakdown or not breakdown.get("samples"):
            self.update("Where the time goes: waiting for stack samples…")
            return
        shares = breakdown["shares"]
        text.append("Where the loop's time goes ", style="bold")
        text.append(f"({breakdown['samples']} samples)\n")
        for cat, (_label, style) in CATEGORY_STYLE.items():
            n = int(round(shares.get(cat, 0.0) * width))
            if n:
                text.append("█" * n, style=style)
        legend = [
            (f"{label} {shares.get(cat, 0.0):.0%}", style)
            for cat, (label, style) in CATEGORY_STYLE.items()
            if shares.get(cat, 0.0) >= 0.01
        ]
        self.update(Group(text, Legend(legend)))


class Legend:
    """Coloured "■ label share" items, wrapped between items only."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self.items = items

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = Text(no_wrap=True, overflow="ellipsis")
        for label, style in self.items:
            if line.cell_len and line.cell_len + 4 + len(label) > options.max_width:
                yield line
                line = Text(no_wrap=True, overflow="ellipsis")
            if line.cell_len:
                line.append("  ")
            line.append("■ ", style=style)
            line.append(label)
        yield line


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}


def shorten(text: str, width: int) -> str:
    """`text` in `width` cells, cut with an ellipsis."""
    return text if len(text) <= width else text[: max(0, width - 1)].rstrip() + "…"


class FindingsTable(DataTable):
    """Findings ranked by impact: id, title (shortened to fit), impact, speed-up; the
    severity gets its own column when there is room. Enter opens one."""

    FIXED = (("id", 8), ("impact", 6), ("speed-up", 10))
    SEVERITY_FROM = 90  # table width from which the severity column is shown

    findings: list[dict] = []

    def on_mount(self) -> None:
        self.cursor_type = "row"

    def on_resize(self) -> None:
        self.show(self.findings)

    def _title_width(self, severity: bool) -> int:
        width = self.size.width or self.app.size.width
        fixed = sum(w + 2 for _, w in self.FIXED) + (9 + 2 if severity else 0)
        return max(10, width - fixed - 2 - 2)  # cell padding, scrollbar

    def show(self, findings: list[dict]) -> None:
        keep = self.cursor_row
        self.findings = findings
        severity = (self.size.width or self.app.size.width) >= self.SEVERITY_FROM
        title_w = self._title_width(severity)
        self.clear(columns=True)
        self.add_column("id", width=8)
        if severity:
            self.add_column("severity", width=9)
        self.add_column("finding", width=title_w)
        self.add_column(Text("impact", justify="right"), width=6)
        self.add_column(Text("speed-up", justify="right"), width=self.FIXED[2][1])
        for i, f in enumerate(findings):
            sev = SEVERITY_STYLE[f["severity"]]
            cells: list[str | Text] = [Text(printable(f["id"]), style=sev)]  # never markup
            if severity:
                cells.append(Text(f["severity"], style=sev))
            cells += [
                Text(shorten(printable(f["title"]), title_w)),
                Text(f"{f['impact']:.0%}", justify="right"),
                Text(speedup_text(f), justify="right"),
            ]
            self.add_row(*cells, key=str(i))  # by place: two findings may share an id
        if findings:
            self.move_cursor(row=min(keep, len(findings) - 1))


def _ms(v: float | None) -> str:
    return "?" if v is None else f"{v * 1e3:.1f} ms"


def request_rows(doc: dict, line: Callable[..., object]) -> bool:
    """A server's or an inference loop's view (kind, requests/s, latency percentiles, in
    flight, forwards and their batch); False for a training job (its rows stay as they were)."""
    w, m = doc.get("workload") or {}, doc.get("metrics", {})
    if w.get("kind") not in ("server", "inference"):
        return False
    line("workload", [f"{w['kind']} (unit: the {w.get('unit')})"])
    if m.get("requests_per_second") is not None:
        triton = m.get("executions") is not None
        how = "Triton's counters" if triton else "measured by the hooks"
        line("requests", [f"{m['requests_per_second']:.1f}/s", how])
        line(
            "latency",
            [f"p{q} {_ms(m.get(f'request_latency_p{q}_s'))}" for q in (50, 95, 99)]
            + ([f"mean {_ms(m.get('request_latency_mean_s'))}"] if triton else []),
        )
        if triton:
            line(
                "in Triton",
                [
                    f"{m.get('request_queue_share') or 0:.0%} queued",
                    f"{m.get('requests_per_execution') or 0:.1f} requests an execution",
                ],
            )
        line(
            "in flight",
            [f"{m.get('requests_in_flight_mean') or 0:.1f} on average"]
            + (
                [f"max {m['requests_in_flight_max']:.0f}"]
                if m.get("requests_in_flight_max") is not None
                else []
            ),
        )
    elif m.get("requests_in_flight_est") is not None:
        line("in flight", [f"{m['requests_in_flight_est']:.1f} on average", "from the stacks"])
    if m.get("forwards_per_second") is not None:
        line(
            "model forwards",
            [f"{m['forwards_per_second']:.1f}/s", f"{m.get('items_per_second') or 0:.0f} items/s"]
            + [f"batch p50 {m.get('forward_batch_p50') or 0:.0f}"],
        )
    if m.get("padding_share") is not None and m.get("forwards_per_second") is not None:
        line(
            "tokens",
            [
                f"{m['padding_share']:.0%} padding",
                f"padded to {m.get('padded_length_mean') or 0:.0f}",
                f"longest {m.get('longest_length_mean') or 0:.0f}",
                f"real {m.get('real_length_mean') or 0:.0f}",
            ],
        )
    return True


def step_rows(m: dict, line: Callable[..., object], served: bool) -> None:
    """A training loop's throughput and step time (n/a without step timing, unless the
    request view already says what the job does)."""
    if m.get("steps_per_second"):
        line(
            "throughput",
            [f"{m['steps_per_second']:.2f} steps/s"]
            + ([f"{m['samples_per_second']:.0f} samples/s"] if m.get("samples_per_second") else []),
        )
        line(
            "step time",
            [
                f"p50 {m['step_time_p50_s'] * 1000:.0f} ms",
                f"p95 {m['step_time_p95_s'] * 1000:.0f} ms",
            ],
        )
    elif not served:
        line("throughput", ["n/a", "no in-process step timing"])


def metrics_text(doc: dict) -> Wrapped:
    """Throughput, host and GPU numbers, each with its unit (never split from it)."""
    m = doc.get("metrics", {})
    t = Wrapped()
    line = t.row

    step_rows(m, line, request_rows(doc, line))
    if m.get("host_cpu_util") is not None:
        line(
            "host CPU",
            [f"{m['host_cpu_util']:.0%} of {m.get('cpu_count') or 0:.0f} cores"]
            + ([f"iowait {m['host_iowait']:.0%}"] if m.get("host_iowait") is not None else []),
        )
    if m.get("psi_io_some") is not None:
        line(
            "pressure",
            [
                f"io {m['psi_io_some']:.0%}",
                f"cpu {m.get('psi_cpu_some') or 0:.0%}",
                f"memory {m.get('psi_memory_some') or 0:.0%}",
            ],
        )
    if m.get("workers"):
        line(
            "loader workers",
            [f"{m['workers']:.0f} using {m.get('worker_cpu_cores') or 0:.1f} cores"],
        )
    gpus = [k for k in m if k.startswith("gpu") and k.endswith("_busy")]
    for k in sorted(gpus):
        idx = k[3:-5]
        peak = m.get(f"gpu{idx}_vram_peak_bytes")
        line(
            f"GPU {idx}",
            [f"busy {m[k]:.0%}" if m[k] is not None else "busy n/a"]
            + ([f"VRAM peak {peak / 2**30:.1f} GiB"] if peak else []),
        )
    if not gpus:
        gpu = next((p for p in doc.get("probes", []) if p["name"] == "gpu"), None)
        if gpu and not gpu["available"]:
            t.para(f"none: {gpu['reason']}", lead="GPU".ljust(18))
    rank_rows(doc, line)
    cost = doc.get("cost") or {}
    if cost.get("available"):
        line(
            "cost",
            [
                f"${cost['usd_per_day']:,.0f}/day",
                f"idle ${cost['idle']['usd_per_day']:,.0f}/day",
                f"at ${cost['price']['usd_per_gpu_hour']:.2f}/GPU-h",
            ],
        )
    split_rows(doc, t)
    periods = doc.get("periods") or []
    if periods:
        t.blank().para("Over time (from the loop's start)", style="bold")
        if len(periods) > MAX_PERIODS:
            t.para(f"{len(periods) - MAX_PERIODS} earlier periods: see the report")
        for p in periods[-MAX_PERIODS:]:
            span, what = period_parts(p)
            line(span, what)
    return t


MAX_PERIODS = 12  # the newest periods shown in the numbers panel
MAX_SPLIT = 6  # the model's top call sites shown (the report's compute_stacks)


def split_rows(doc: dict, t: Wrapped) -> None:
    """The model's time by call site, estimated from the stacks (plain attach): its top rows,
    each with its share of the loop and its samples."""
    cs = doc.get("compute_stacks") or {}
    rows = [r for r in cs.get("rows") or [] if r.get("share", 0.0) >= 0.005]
    if not rows:
        return
    what = "launch time" if cs.get("time") == "launch" else "CPU time"
    t.blank().para(f"Model time by call site (stacks, % of the loop, {what})", style="bold")
    for r in rows[:MAX_SPLIT]:
        t.row(f"{r['share']:.0%}", [f"{r['samples']:.0f} samples", r.get("label", "")])


def rank_rows(doc: dict, line: Callable[..., object]) -> None:
    """A multi-rank job: one row per rank (step time, data/compute/collective shares, GPU),
    the straggler marked."""
    strag = ((doc.get("distributed") or {}).get("straggler") or {}).get("straggler")
    for r in doc.get("ranks") or []:
        bd = r.get("breakdown") or {}
        st = r.get("step_time_s")
        parts = [f"step {st * 1000:.0f} ms" if st else "step n/a"]
        parts += [f"{k[:4]} {bd[k]:.0%}" for k in ("data", "compute", "collectives") if k in bd]
        if r.get("gpu") is not None:
            g = r.get("gpu_stats") or {}
            held = {k[9:]: v for k, v in g.items() if k.startswith("throttle_") and v}
            worst = max(held.items(), key=lambda kv: kv[1], default=None)
            util = f" util {g['util_gpu']:.0%}" if "util_gpu" in g else ""
            thr = f" {worst[0]} {worst[1]:.0%}" if worst and worst[1] >= 0.05 else ""
            parts.append(f"GPU {r['gpu']}{util}{thr}")
        mark = " straggler" if strag is not None and r["rank"] == strag else ""
        line(f"rank {r['rank']}{mark}", parts)
