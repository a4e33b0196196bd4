"""Widgets of the diagnosis view: the time breakdown bar, the findings table, panels."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable, Static

CATEGORY_STYLE = {
    "data_wait": ("waiting for data", "red"), "storage_io": ("storage", "magenta"),
    "h2d_copy": ("copies", "yellow"), "forward": ("forward", "green"),
    "backward": ("backward", "cyan"), "optimizer": ("optimizer", "blue"),
    "sync": ("sync", "bright_red"), "checkpoint": ("checkpoint", "bright_magenta"),
    "collective": ("collectives", "bright_blue"), "gil_wait": ("GIL wait", "bright_yellow"),
    "other": ("other", "grey50"),
}


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
        text.append("\n")
        for cat, (label, style) in CATEGORY_STYLE.items():
            s = shares.get(cat, 0.0)
            if s >= 0.01:
                text.append("■ ", style=style)
                text.append(f"{label} {s:.0%}  ")
        self.update(text)


class FindingsTable(DataTable):
    """Findings ranked by impact; Enter opens one."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.add_columns("#", "id", "severity", "finding", "impact", "speed-up")

    def show(self, findings: list[dict]) -> None:
        keep = self.cursor_row
        self.clear()
        for i, f in enumerate(findings, 1):
            sev = {"error": "bold red", "warning": "yellow", "note": "cyan"}[f["severity"]]
            self.add_row(str(i), f["id"], Text(f["severity"], style=sev), f["title"],
                         f"{f['impact']:.0%}", f"×{f['expected_speedup']:.2f}", key=f["id"])
        if findings:
            self.move_cursor(row=min(keep, len(findings) - 1))


def metrics_text(doc: dict) -> Text:
    """Throughput, host and GPU numbers, each with its unit."""
    m = doc.get("metrics", {})
    t = Text()

    def line(label: str, value: str) -> None:
        t.append(f"{label:<18}", style="bold")
        t.append(value + "\n")

    if m.get("steps_per_second"):
        line("throughput", f"{m['steps_per_second']:.2f} steps/s"
             + (f" · {m['samples_per_second']:.0f} samples/s"
                if m.get("samples_per_second") else ""))
        line("step time", f"p50 {m['step_time_p50_s'] * 1000:.0f} ms · "
             f"p95 {m['step_time_p95_s'] * 1000:.0f} ms")
    else:
        line("throughput", "n/a (no in-process step timing)")
    if m.get("host_cpu_util") is not None:
        line("host CPU", f"{m['host_cpu_util']:.0%} of {m.get('cpu_count') or 0:.0f} cores"
             + (f" · iowait {m['host_iowait']:.0%}" if m.get("host_iowait") is not None
                else ""))
    if m.get("psi_io_some") is not None:
        line("pressure", f"io {m['psi_io_some']:.0%} · cpu {m.get('psi_cpu_some') or 0:.0%}"
             f" · memory {m.get('psi_memory_some') or 0:.0%}")
    if m.get("workers"):
        line("loader workers", f"{m['workers']:.0f} using {m.get('worker_cpu_cores') or 0:.1f}"
             " cores")
    gpus = [k for k in m if k.startswith("gpu") and k.endswith("_busy")]
    for k in sorted(gpus):
        idx = k[3:-5]
        peak = m.get(f"gpu{idx}_vram_peak_bytes")
        line(f"GPU {idx}", (f"busy {m[k]:.0%}" if m[k] is not None else "busy n/a")
             + (f" · VRAM peak {peak / 2**30:.1f} GiB" if peak else ""))
    if not gpus:
        gpu = next((p for p in doc.get("probes", []) if p["name"] == "gpu"), None)
        if gpu and not gpu["available"]:
            line("GPU", f"none: {gpu['reason']}")
    cost = doc.get("cost") or {}
    if cost.get("available"):
        line("cost", f"${cost['usd_per_day']:,.0f}/day · idle ${cost['idle']['usd_per_day']:,.0f}"
             f"/day at ${cost['price']['usd_per_gpu_hour']:.2f}/GPU-h")
    return t
