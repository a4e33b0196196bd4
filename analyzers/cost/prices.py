"""Reference GPU models and prices, read from the table shipped as data (gpu_table.json).

A model row holds datasheet figures (memory, bandwidth, dense bf16/FP32/TF32 throughput); a
price row holds a dated, sourced GPU-hour price with its on-demand and spot ranges. Figures
are reference points for estimates, not quotes. A user's own price (`--price`,
`[tool.gpudiag.prices]`, a prices file) always wins.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

TABLE_FILE = "gpu_table.json"
DATE_RE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")


@dataclass(frozen=True)
class GpuModel:
    """One GPU model: how to recognise it, its memory and its datasheet throughput."""

    key: str
    label: str
    match: str  # regex on the NVML device name
    memory_gib: float
    hbm_gb_s: float  # memory bandwidth, GB/s
    bf16_tflops: float  # dense bf16 (or fp16) tensor throughput
    fp32_tflops: float  # dense FP32 on the CUDA cores
    tf32_tflops: float | None  # dense TF32 on tensor cores; None: no TF32
    datasheet: str


@dataclass(frozen=True)
class PriceRow:
    """One dated, sourced GPU-hour price of a model, with its ranges."""

    model: str
    usd_per_gpu_hour: float
    reference: str  # whose figure usd_per_gpu_hour is
    on_demand_usd: tuple[float, float]
    spot_usd: tuple[float, float] | None
    providers: tuple[tuple[str, float], ...]
    source: str
    url: str
    date: str  # YYYY-MM or YYYY-MM-DD

    def day(self) -> datetime.date:
        """The row's date (the first of its month when it gives no day)."""
        parts = [int(p) for p in self.date.split("-")]
        return datetime.date(parts[0], parts[1], parts[2] if len(parts) > 2 else 1)

    def to_dict(self) -> dict:
        """JSON form used in reports."""
        return {
            "model": self.model,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "reference": self.reference,
            "on_demand_usd": list(self.on_demand_usd),
            "spot_usd": list(self.spot_usd) if self.spot_usd else None,
            "providers": dict(self.providers),
            "source": self.source,
            "url": self.url,
            "date": self.date,
        }


def _range(v: Any) -> tuple[float, float] | None:
    return None if v is None else (float(v[0]), float(v[1]))


def price_row(raw: dict) -> PriceRow:
    """A price row from its JSON form; ValueError when it lacks a source, URL or date."""
    for key in ("model", "source", "url", "date"):
        if not str(raw.get(key) or "").strip():
            raise ValueError(f"price row {raw.get('model')!r} has no {key}")
    if not DATE_RE.match(str(raw["date"])):
        raise ValueError(f"price row {raw['model']!r}: date {raw['date']!r} is not YYYY-MM[-DD]")
    on_demand = _range(raw.get("on_demand_usd"))
    if on_demand is None:
        raise ValueError(f"price row {raw['model']!r} has no on-demand range")
    return PriceRow(
        str(raw["model"]),
        float(raw["usd_per_gpu_hour"]),
        str(raw.get("reference") or ""),
        on_demand,
        _range(raw.get("spot_usd")),
        tuple((str(k), float(v)) for k, v in (raw.get("providers") or {}).items()),
        str(raw["source"]),
        str(raw["url"]),
        str(raw["date"]),
    )


def load_table(text: str) -> tuple[tuple[GpuModel, ...], tuple[PriceRow, ...]]:
    """The models and price rows of a table's JSON text (every price row checked)."""
    data = json.loads(text)
    models = tuple(GpuModel(**m) for m in data["models"])
    rows = tuple(price_row(r) for r in data["prices"])
    keys = {m.key for m in models}
    for r in rows:
        if r.model not in keys:
            raise ValueError(f"price row for unknown model {r.model!r}")
    return models, rows


def table_text() -> str:
    """The shipped table's JSON text."""
    return resources.files("gpudiag.analyzers.cost").joinpath(TABLE_FILE).read_text()


MODELS, PRICES = load_table(table_text())

SPOT_NOTE = (
    "spot/preemptible capacity typically costs 60-90% less, with 30 s to 2 min of "
    "termination notice; reserved capacity is 30-60% cheaper for 1-3 year commitments"
)


def identify(gpu_name: str) -> GpuModel | None:
    """The reference model whose pattern matches an NVML device name (first match)."""
    for m in MODELS:
        if re.search(m.match, gpu_name, re.IGNORECASE):
            return m
    return None


def by_key(key: str) -> GpuModel | None:
    """A model by its key (case-insensitive), e.g. 'H100-SXM' or 'L4'."""
    for m in MODELS:
        if m.key.lower() == key.lower():
            return m
    return None


def row_of(key: str) -> PriceRow | None:
    """The reference price row of a model key, if the table prices it."""
    return next((r for r in PRICES if r.model.lower() == key.lower()), None)


@dataclass(frozen=True)
class Price:
    """The price a run's money figures use, and where it came from (`row`: the reference
    table's row, when the price is the built-in one)."""

    usd_per_gpu_hour: float
    source: str
    model: str | None = None
    row: PriceRow | None = None

    def to_dict(self) -> dict:
        """JSON form used in reports."""
        out: dict = {
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "source": self.source,
            "model": self.model,
        }
        if self.row is not None:
            out["date"] = self.row.date
            out["row"] = self.row.to_dict()
        return out
