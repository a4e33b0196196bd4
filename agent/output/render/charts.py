"""Inline SVG charts for the HTML report: the run's timeline, the breakdown bar, the flame
graph and the capture's steps. Plain SVG text, no script: the page opens offline, prints,
and tooltips are SVG <title> elements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

COLORS = {
    "data_wait": "#e45756",
    "storage_io": "#9d755d",
    "h2d_copy": "#f58518",
    "forward": "#4c78a8",
    "backward": "#72b7b2",
    "optimizer": "#54a24b",
    "sync": "#b279a2",
    "checkpoint": "#ff9da6",
    "collective": "#eeca3b",
    "gil_wait": "#bab0ac",
    "startup": "#d6d6d6",
    "other": "#8c8c8c",
}
GPU_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
FONT = 'font-family="system-ui,sans-serif" font-size="11"'


def color(category: str) -> str:
    """The colour of a breakdown category (grey for unknown ones)."""
    return COLORS.get(category, "#8c8c8c")


def _fmt_s(v: float) -> str:
    return f"{v:.0f}s" if v >= 10 else f"{v:.1f}s"


@dataclass(frozen=True)
class _Frame:
    """The timeline's plot area: its left edge and width, the top and bottom of its lanes,
    and the run's end (s), which the time axis spans."""

    left: int
    width: int
    top: int
    bottom: int
    end: float

    def x(self, t: float) -> float:
        """The x of a time of the run."""
        return self.left + self.width * max(0.0, min(t, self.end)) / self.end


def timeline_svg(
    series: Mapping[str, Any], capture: Mapping[str, Any] | None = None, width: int = 960
) -> str:
    """GPU utilisation per GPU, the loop thread's phases and the steps per second over the
    run, on one time axis; start-up/shutdown shaded, the loop window and capture marked."""
    pts = series.get("points") or []
    if not pts:
        return "<p class=muted>No samples over time in this report.</p>"
    left, right, lane = 60, 12, 90
    end = max(p["t_s"] + p["dur_s"] for p in pts) or 1.0
    w = width - left - right
    gpus = sorted({g for p in pts for g in p.get("gpu_util", {})}, key=lambda g: (len(g), g))
    lanes = (["gpu"] if gpus else []) + ["phases", "steps"]
    height = 24 + lane * len(lanes) + 26 * (len(lanes) - 1) + 30
    top0 = 24
    f = _Frame(left, w, top0, top0 + lane * len(lanes) + 26 * (len(lanes) - 1), end)
    x = f.x
    out = [f'<svg class=chart viewBox="0 0 {width} {height}" width="100%" {FONT}>']
    out += _run_marks(series, f) + _capture_mark(capture, f)
    for i, name in enumerate(lanes):
        top = top0 + i * (lane + 26)
        out.append(
            f'<rect x="{left}" y="{top}" width="{w}" height="{lane}" fill="none" stroke="#ccc"/>'
        )
        if name == "gpu":
            out.append(_gpu_lane(pts, gpus, x, top, lane, left))
        elif name == "phases":
            out.append(_phase_lane(pts, x, top, lane, left))
        else:
            out.append(_step_lane(pts, x, top, lane, left))
    axis_y = f.bottom + 14
    for k in range(6):
        t = end * k / 5
        anchor = "start" if k == 0 else "end" if k == 5 else "middle"
        out.append(f'<text x="{x(t):.1f}" y="{axis_y}" text-anchor="{anchor}">{_fmt_s(t)}</text>')
    out.append("</svg>")
    return "".join(out)


def _run_marks(series: Mapping[str, Any], f: _Frame) -> list[str]:
    """Start-up and shutdown shaded, the loop (the analysed window) labelled."""
    x, left, top0, bottom = f.x, f.left, f.top, f.bottom
    out = []
    lo, hi = series.get("loop_start_s"), series.get("loop_end_s")
    if lo is not None:
        out.append(
            f'<rect x="{left}" y="{top0 - 8}" width="{x(lo) - left:.1f}" '
            f'height="{bottom - top0 + 8}" fill="#f3f3f3"><title>start-up</title></rect>'
        )
        if x(lo) - left > 70:  # room for the label
            out.append(f'<text x="{left + 3}" y="{top0 - 12}" fill="#777">start-up</text>')
    if hi is not None and hi < f.end:
        out.append(
            f'<rect x="{x(hi):.1f}" y="{top0 - 8}" width="{left + f.width - x(hi):.1f}" '
            f'height="{bottom - top0 + 8}" fill="#f3f3f3"><title>shutdown</title></rect>'
        )
    if lo is not None:
        out.append(f'<text x="{x(lo) + 3:.1f}" y="{top0 - 12}" fill="#333">loop (analysed)</text>')
    return out


def _capture_mark(capture: Mapping[str, Any] | None, f: _Frame) -> list[str]:
    """Where in the run the profiler capture ran."""
    if not capture or not capture.get("steps"):
        return []
    c0 = capture.get("start_s_run")
    if not isinstance(c0, (int, float)):
        return []
    x, top0, bottom = f.x, f.top, f.bottom
    cw = max(5.0, f.width * (capture.get("window_s") or 0.0) / f.end)
    return [
        f'<text x="{x(c0) + cw / 2:.1f}" y="{bottom + 26}" text-anchor="middle" '
        'fill="#a07000">capture</text>',
        f'<rect x="{x(c0):.1f}" y="{top0 - 8}" width="{cw:.1f}" '
        f'height="{bottom - top0 + 8}"'
        ' fill="#f0b400" opacity="0.55"><title>profiler capture</title></rect>',
    ]


def _gpu_lane(pts: Any, gpus: Any, x: Any, top: Any, lane: Any, left: Any) -> str:
    out = [f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">100%</text>']
    out.append(f'<text x="{left - 6}" y="{top + 26}" text-anchor="end">GPU util</text>')
    out.append(f'<text x="{left - 6}" y="{top + lane}" text-anchor="end">0</text>')
    for j, g in enumerate(gpus):
        path: list[str] = []
        for p in pts:
            v = p.get("gpu_util", {}).get(g)
            if v is None:
                continue
            cmd = "L" if path else "M"
            path.append(f"{cmd}{x(p['t_s'] + p['dur_s'] / 2):.1f},{top + lane * (1 - v):.1f}")
        col = GPU_COLORS[j % len(GPU_COLORS)]
        out.append(
            f'<path d="{" ".join(path)}" fill="none" stroke="{col}" stroke-width="1.6">'
            f"<title>GPU {escape(g)} utilisation (NVML)</title></path>"
        )
    return "".join(out)


def _phase_lane(pts: Any, x: Any, top: Any, lane: Any, left: Any) -> str:
    """Each stack window's phases as a stacked column from the previous window's end."""
    out = [f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">100%</text>']
    out.append(f'<text x="{left - 6}" y="{top + 26}" text-anchor="end">phases</text>')
    prev = 0.0
    for p in pts:
        t1 = p["t_s"] + p["dur_s"]
        if not p.get("phases"):
            continue
        y = top + lane
        for cat, share in sorted(p["phases"].items(), key=lambda kv: kv[0]):
            h = lane * share
            y -= h
            out.append(
                f'<rect x="{x(prev):.1f}" y="{y:.1f}" width="{max(0.5, x(t1) - x(prev)):.1f}" '
                f'height="{h:.1f}" fill="{color(cat)}"><title>{escape(cat)} '
                f"{share:.0%} ({_fmt_s(prev)}-{_fmt_s(t1)})</title></rect>"
            )
        prev = t1
    return "".join(out)


def _step_lane(pts: Any, x: Any, top: Any, lane: Any, left: Any) -> str:
    out = [f'<text x="{left - 6}" y="{top + 26}" text-anchor="end">steps/s</text>']
    rates = [p["steps"] / p["dur_s"] for p in pts if p["dur_s"] > 0]
    peak = max(rates, default=0.0)
    if peak <= 0:
        out.append(
            f'<text x="{left + 8}" y="{top + lane / 2}" fill="#777">no steps timed '
            "(the in-process hooks were not connected)</text>"
        )
        return "".join(out)
    out.append(f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">{peak:.3g}</text>')
    for p in pts:
        if p["dur_s"] <= 0 or not p["steps"]:
            continue
        r = p["steps"] / p["dur_s"]
        h = lane * r / peak
        x0, x1 = x(p["t_s"]), x(p["t_s"] + p["dur_s"])
        st = p.get("step_time_s")
        tip = f"{p['steps']} steps at {_fmt_s(p['t_s'])}" + (
            f", {st * 1000:.1f} ms/step" if st else ""
        )
        out.append(
            f'<rect x="{x0:.1f}" y="{top + lane - h:.1f}" width="{max(0.5, x1 - x0 - 0.5):.1f}" '
            f'height="{h:.1f}" fill="#4c78a8"><title>{tip}</title></rect>'
        )
    return "".join(out)


def gpu_legend(series: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, colour) of each GPU line in the timeline, in drawing order."""
    pts = series.get("points") or []
    gpus = sorted({g for p in pts for g in p.get("gpu_util", {})}, key=lambda g: (len(g), g))
    return [(f"GPU {g}", GPU_COLORS[j % len(GPU_COLORS)]) for j, g in enumerate(gpus)]


def breakdown_svg(shares: Mapping[str, Any], width: int = 960) -> str:
    """One horizontal bar: the loop's wall time by category, labelled where wide enough."""
    items = [(c, v) for c, v in shares.items() if v > 0]
    out = [f'<svg class=chart viewBox="0 0 {width} 34" width="100%" {FONT}>']
    x0 = 0.0
    for cat, v in items:
        w = width * v
        out.append(
            f'<rect x="{x0:.1f}" y="2" width="{w:.1f}" height="30" fill="{color(cat)}">'
            f"<title>{escape(cat)}: {v:.1%}</title></rect>"
        )
        if w > 70:
            out.append(f'<text x="{x0 + 5:.1f}" y="21" fill="#fff">{escape(cat)} {v:.0%}</text>')
        x0 += w
    out.append("</svg>")
    return "".join(out)


def flame_svg(
    stacks: Mapping[str, Any], width: int = 960, row: int = 17, max_depth: int = 40
) -> str:
    """An icicle flame graph (root at the top) of the loop thread's stacks: a frame's width
    is its share of samples, its colour the category of the stacks under it."""
    frames = stacks.get("frames") or []
    rows = stacks.get("stacks") or []
    total = sum(s["count"] for s in rows)
    if not rows or total <= 0:
        return "<p class=muted>No stack samples of the loop thread.</p>"
    tree: dict = {"n": 0.0, "kids": {}, "cats": {}}
    for s in rows:
        node = tree
        node["n"] += s["count"]
        for fid in s["frames"][:max_depth]:
            node = node["kids"].setdefault(fid, {"n": 0.0, "kids": {}, "cats": {}})
            node["n"] += s["count"]
            cat = s.get("category", "other")
            node["cats"][cat] = node["cats"].get(cat, 0.0) + s["count"]
    rects: list[str] = []
    depth_used = [0]

    def walk(node: Mapping[str, Any], x0: float, depth: int) -> None:
        for fid, kid in sorted(node["kids"].items(), key=lambda kv: -kv[1]["n"]):
            w = width * kid["n"] / total
            if w >= 0.8:
                depth_used[0] = max(depth_used[0], depth + 1)
                name = frames[fid] if 0 <= fid < len(frames) else "?"
                cat = max(kid["cats"], key=kid["cats"].get)
                short = name.split(" (", 1)[0]
                label = escape(short[: int(w / 6.5)]) if w > 30 else ""
                rects.append(
                    f'<g><rect x="{x0:.1f}" y="{depth * row}" width="{max(0.5, w - 0.5):.1f}" '
                    f'height="{row - 1}" fill="{color(cat)}" rx="2"><title>{escape(name)} - '
                    f"{kid['n'] / total:.1%} of samples ({escape(cat)})</title></rect>"
                    + (
                        f'<text x="{x0 + 3:.1f}" y="{depth * row + 12}">{label}</text>'
                        if label
                        else ""
                    )
                    + "</g>"
                )
                walk(kid, x0, depth + 1)
            x0 += w

    walk(tree, 0.0, 0)
    h = depth_used[0] * row + 2
    return (
        f'<svg class="chart flame" viewBox="0 0 {width} {h}" width="100%" {FONT} fill="#222">'
        + "".join(rects)
        + "</svg>"
    )


def capture_steps_svg(steps: Sequence[Mapping[str, Any]], width: int = 960) -> str:
    """The captured steps side by side: busy (device or top-level ops) and idle per step."""
    if not steps:
        return ""
    longest = max(s["dur_s"] for s in steps) or 1.0
    bw = width / len(steps)
    out = [f'<svg class=chart viewBox="0 0 {width} 120" width="100%" {FONT}>']
    for i, s in enumerate(steps):
        h = 100 * s["dur_s"] / longest
        busy = s.get("busy_s")
        bh = 100 * busy / longest if busy is not None else 0.0
        x0 = i * bw + 2
        out.append(
            f'<rect x="{x0:.1f}" y="{100 - h:.1f}" width="{bw - 4:.1f}" height="{h:.1f}" '
            f'fill="#e45756"><title>step {i + 1}: {s["dur_s"] * 1000:.1f} ms</title></rect>'
        )
        if busy is not None:
            out.append(
                f'<rect x="{x0:.1f}" y="{100 - bh:.1f}" width="{bw - 4:.1f}" height="{bh:.1f}" '
                f'fill="#4c78a8"><title>busy {busy * 1000:.1f} ms</title></rect>'
            )
        out.append(f'<text x="{x0 + bw / 2 - 2:.1f}" y="114" text-anchor="middle">{i + 1}</text>')
    out.append("</svg>")
    return "".join(out)
