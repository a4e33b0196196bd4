"""User settings: thresholds and frame rules from pyproject.toml or a TOML file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import Untrusted, parse_toml, read_bounded
from gpudiag.analyzers.cost.prices import Price
from gpudiag.analyzers.measures.rules import Rule, rules_from_config
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.text.sink import say


@dataclass(frozen=True)
class Settings:
    """What a run is analysed with, and where it came from."""

    thresholds: Thresholds
    rules: tuple[Rule, ...]
    source: str | None
    price: Price | None = None
    price_table: dict[str, float] | None = None
    otlp_endpoint: str | None = None  # [otlp] endpoint: where run/attach/watch export
    otlp_protocol: str | None = None  # [otlp] protocol: grpc or http/protobuf


MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a settings file is a few KiB; refuse a runaway file


def read_section(
    path: Path, whole_file: bool, what: str = "config file", trusted_for: int | None = None
) -> dict:
    """gpudiag's table of a TOML file: [tool.gpudiag] (of a pyproject.toml), or, with
    `whole_file`, the whole file when it has no [tool] table. UsageError when unreadable;
    Untrusted, with `trusted_for`, when another user could have planted or changed it."""
    raw = read_bounded(path, MAX_CONFIG_BYTES, what, trusted_for)
    data = parse_toml(raw, f"{what} {path}")
    if whole_file and "tool" not in data:
        return data
    tool = data.get("tool", {})
    section = tool.get("gpudiag", {}) if isinstance(tool, dict) else {}
    if not isinstance(section, dict):
        raise UsageError(f"config {path}: [tool.gpudiag] must be a table")
    return section


def _table(section: dict, key: str, source: str | None) -> dict:
    value = section.get(key) or {}
    if not isinstance(value, dict):
        raise UsageError(f"{source or 'settings'}: [{key}] must be a table of name = value")
    return value


def _rule_list(section: dict, source: str | None) -> list:
    value = section.get("rules") or []
    if not isinstance(value, list):
        raise UsageError(f"{source or 'settings'}: rules must be an array of tables ([[rules]])")
    return value


def _price_table(raw: object, where: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: [prices] must be a table of GPU model = USD per GPU-hour")
    out = {}
    for k, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e9:
            raise UsageError(
                f"{where}: price for {k!r} must be a finite non-negative number (USD per GPU-hour)"
            )
        out[str(k)] = float(v)
    return out


def _is_file(path: Path) -> bool:
    """Path.is_file(), False where the folder cannot be searched (was an internal error)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _implicit_section(pp: Path) -> tuple[dict, str | None]:
    """[tool.gpudiag] of ./pyproject.toml, found rather than named: read only when it is the
    user's (or root's) and only they may write it, else ignored with one line saying why."""
    if not _is_file(pp):
        return {}, None
    try:
        section = read_section(pp, whole_file=False, what="config", trusted_for=os.geteuid())
    except Untrusted as exc:
        say(f"ignoring {exc}")
        return {}, None
    except UsageError:
        return {}, None
    return section, (f"{pp} [tool.gpudiag]" if section else None)


def load_settings(
    config: str | None,
    overrides: list[str] | None = None,
    cwd: Path | None = None,
    price: float | None = None,
    prices_file: str | None = None,
) -> Settings:
    """Read `--config FILE` (or ./pyproject.toml's [tool.gpudiag]) and `--set name=value`s.

    The file may hold `[thresholds]` (name = value) and `[[rules]]` tables (category, and one
    or more of function, file, code), at top level or under [tool.gpudiag].
    """
    section: dict = {}
    source = None
    if config:
        path = Path(config)
        section, source = read_section(path, whole_file=True), str(path)
    else:
        section, source = _implicit_section((cwd or Path.cwd()) / "pyproject.toml")
    cli_over: dict[str, object] = {}
    for item in overrides or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set needs name=value, got {item!r}")
        cli_over[name.strip()] = value.strip()
    try:
        thresholds = Thresholds().with_overrides(dict(_table(section, "thresholds", source)))
        rules = rules_from_config(list(_rule_list(section, source)))
    except ValueError as exc:
        raise UsageError(f"{source or 'settings'}: {exc}") from None
    try:
        thresholds = thresholds.with_overrides(cli_over)
    except ValueError as exc:
        raise UsageError(f"--set: {exc}") from None
    table: dict[str, float] = {}
    if prices_file:
        path = Path(prices_file)
        data = read_section(path, whole_file=True, what="prices file")
        table.update(_price_table(data.get("prices", data), prices_file))
    elif "prices" in section:
        table.update(_price_table(section["prices"], source or "settings"))
    explicit = None
    if price is not None:
        if not 0 <= price < 1e9:  # also refuses nan and inf
            raise UsageError("--price must be a finite non-negative number (USD per GPU-hour)")
        explicit = Price(price, "--price")
    otlp, protocol = _otlp(section, source)
    return Settings(thresholds, rules, source, explicit, table, otlp, protocol)


def _otlp(section: dict, source: str | None) -> tuple[str | None, str | None]:
    """[otlp] endpoint and protocol (checked as strings; the protocol's value by fleet/otlp)."""
    table = _table(section, "otlp", source)
    endpoint, protocol = table.get("endpoint"), table.get("protocol")
    if endpoint is not None and not isinstance(endpoint, str):
        raise UsageError(f"{source}: [otlp] endpoint must be a URL string")
    if protocol is not None and protocol not in ("grpc", "http/protobuf"):
        raise UsageError(f'{source}: [otlp] protocol must be "grpc" or "http/protobuf"')
    return endpoint, protocol
