"""The report's right-size projection (a model) and its price's age, as lines and a table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpudiag.agent.output.report_types import Report

SPLIT_WORDS = {"tensor": "tensor", "memory": "memory", "compute": "FP32", "latency": "rest"}


def price_age_lines(cost: Mapping[str, Any]) -> list[str]:
    """The reference price row's date, range and source; a flag when older than a year."""
    p = cost.get("price") or {}
    row = p.get("row")
    if not row:
        return []
    lo, hi = row["on_demand_usd"]
    spot = row.get("spot_usd")
    out = [
        f"  price row {row['model']}, {row['date']}: on-demand ${lo:.2f}-{hi:.2f}/GPU-hour"
        + (f", spot ${spot[0]:.2f}-{spot[1]:.2f}" if spot else "")
        + f" ({row['source']}; {row['url']})"
    ]
    if p.get("stale"):
        out.append(
            f"  ! price dated {row['date']} is older than a year at this run "
            f"({p.get('age_days')} days): refresh it or give --price"
        )
    return out


def _basis_text(rs: Mapping[str, Any]) -> str:
    b = rs["basis"]
    split = ", ".join(
        f"{SPLIT_WORDS[k]} {v:.0%}" for k, v in b["split_of_gpu_time"].items() if v >= 0.005
    )
    return (
        f"{b['bound']}; GPU busy {b['gpu_busy']:.0%} ({split} of its time), host and waits "
        f"{b['host_share']:.0%} unchanged; {b['host_and_gpu']}"
    )


def _row_text(r: Mapping[str, Any], unit: str) -> str:
    lo, hi = r["relative_speed_band"]
    speed = "measured" if r["measured"] else f"x{r['relative_speed']:.2f} (x{lo:.2f}-{hi:.2f})"
    rate = "" if r.get("units_per_s") is None else f"{r['units_per_s']:.3g} {unit}s/s"
    per = r.get("usd_per_1000_units")
    money = "" if per is None else f"${per:.4g} per 1,000 {unit}s"
    return (
        f"    {r['label']:<20} ${r['usd_per_gpu_hour']:>5.2f}/h  {speed:<22} {rate:<16} {money}"
    ).rstrip()


def right_size_lines(doc: Report) -> list[str]:
    """'Right-size (model): ...', its basis, the table and the two picks; [] without one."""
    rs = doc.get("right_size")
    if not rs:
        return []
    if not rs.get("available"):
        return [f"Right-size (model): {rs.get('statement') or rs.get('reason')}"]
    out = [f"Right-size (model, band: {rs['basis']['band']}): {_basis_text(rs)}"]
    out += [_row_text(r, rs["unit"]) for r in rs["rows"]]
    out += [f"  {s}" for s in rs.get("statements") or []]
    out.append(f"  {rs['note']}")
    return out


def right_size_table_html(doc: Report, esc: Callable[[object], str]) -> str:
    """The right-size rows as an HTML table (esc: the page's escaping function)."""
    rs = doc.get("right_size") or {}
    if not rs.get("available"):
        return ""
    unit = rs["unit"]
    head = (
        "<tr><th>GPU</th><th>$/GPU-hour</th><th>speed (model)</th><th>band</th>"
        f"<th>{esc(unit)}s/s</th><th>$ per 1,000 {esc(unit)}s</th></tr>"
    )
    cells = []
    for r in rs["rows"]:
        lo, hi = r["relative_speed_band"]
        rate = "" if r.get("units_per_s") is None else f"{r['units_per_s']:.3g}"
        per = "" if r.get("usd_per_1000_units") is None else f"{r['usd_per_1000_units']:.4g}"
        speed = "measured" if r["measured"] else f"x{r['relative_speed']:.2f}"
        cells.append(
            f"<tr><td>{esc(r['label'])}</td><td>{r['usd_per_gpu_hour']:.2f}</td>"
            f"<td>{speed}</td><td>x{lo:.2f}-{hi:.2f}</td><td>{rate}</td><td>{per}</td></tr>"
        )
    return f"<table>{head}{''.join(cells)}</table>"
