"""How report values read, written once for the text and markdown renderers and the TUI:
category labels, values with their units, evidence with the threshold it crossed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# (long label for summaries, short label for the TUI's legend) per breakdown category
CATEGORY_LABELS: dict[str, tuple[str, str]] = {
    "data_wait": ("waiting for data (CPU)", "waiting for data"),
    "storage_io": ("waiting on storage", "storage"),
    "h2d_copy": ("host-to-device copies", "copies"),
    "forward": ("forward", "forward"),
    "backward": ("backward", "backward"),
    "optimizer": ("optimizer", "optimizer"),
    "sync": ("host-device sync", "sync"),
    "checkpoint": ("checkpoint saves", "checkpoint"),
    "collective": ("collectives", "collectives"),
    "gil_wait": ("waiting for the GIL", "GIL wait"),
    "other": ("other", "other"),
}
LABELS = {c: long for c, (long, _short) in CATEGORY_LABELS.items()}
SHORT_LABELS = {c: short for c, (_long, short) in CATEGORY_LABELS.items()}


def fmt_value(value: float | None, unit: str) -> str:
    """A number with its unit, human-sized."""
    if value is None:
        return "n/a"
    if unit == "ratio":
        return f"{value:.1%}"
    if unit == "bytes":
        for u, d in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= d:
                return f"{value / d:.1f} {u}"
        return f"{value:.0f} B"
    if unit == "bytes/s":
        return f"{value / 1e6:.1f} MB/s"
    if float(value).is_integer():
        return f"{value:.0f} {unit}".strip()
    return f"{value:.2f} {unit}".strip()


def evidence_parts(e: Mapping[str, Any], with_metric: bool = True) -> list[str]:
    """An evidence item as parts: 'metric = value', '(>= setting threshold)', '[source]'."""
    unit = e.get("unit", "")
    value = fmt_value(e.get("value"), unit)
    parts = [f"{e['metric']} = {value}" if with_metric else value]
    if e.get("threshold") is not None:
        parts.append(
            f"({e.get('comparison') or 'vs'} {e.get('setting') or 'threshold'} "
            f"{fmt_value(e['threshold'], unit)})"
        )
    if e.get("source"):
        parts.append(f"[{e['source']}]")
    return parts


def clock(seconds: float) -> str:
    """Seconds as h:mm:ss."""
    h, rem = divmod(int(seconds), 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}"


def period_parts(p: Mapping[str, Any]) -> tuple[str, list[str]]:
    """One period of a long loop: its span ("0:00:00-0:10:00") and what it had (its top
    finding with impact, or no bottleneck; the GPU's idle share)."""
    what = [f"{p['finding']} ({p['impact']:.0%})" if p.get("finding") else "no bottleneck"]
    if p.get("gpu_idle") is not None:
        what.append(f"GPU idle {p['gpu_idle']:.0%}")
    return f"{clock(p['start_s'])}-{clock(p['end_s'])}", what


def is_bound(f: Mapping[str, Any]) -> bool:
    """Whether a finding's (or if_fixed's) speed-up is a bound, not a modelled figure.
    A basis that says "a bound" is one whatever the kind field (older reports have none)."""
    if f.get("speedup_kind") == "bound":
        return True
    return str(f.get("speedup_basis") or f.get("basis") or "").startswith("a bound")


def speedup_text(f: Mapping[str, Any]) -> str:
    """The speed-up as it reads everywhere: ×2.65 modelled, "up to ×5.8" for a bound,
    "at least ×1.59" for a floor."""
    speed = float(f.get("expected_speedup") or 1.0)
    if f.get("speedup_kind") == "hypothesis":
        low = float(f.get("speedup_low") or 1.0)
        if f.get("measured_speedup") is not None:
            return f"×{float(f['measured_speedup']):.2f} measured by try (×{low:.2f}-×{speed:.2f})"
        return f"×{low:.2f}-×{speed:.2f}, unverified"
    if f.get("speedup_kind") == "floor":
        if f.get("measured_speedup") is not None:
            return f"×{float(f['measured_speedup']):.2f} measured by try (at least ×{speed:.2f})"
        return f"at least ×{speed:.2f}"
    return f"up to ×{speed:.1f}" if is_bound(f) else f"×{speed:.2f}"
