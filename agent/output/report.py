"""Reports: build the versioned JSON document, validate it, write it atomically, load it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import (
    atomic_write,
    check_distinct,
    dumps_json,
    finite,
    parse_json,
    read_bounded,
)
from gpudiag.agent.output.environment import describe_environment
from gpudiag.analyzers.measures.summary import metric_unit
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.base import ProbeStatus
from gpudiag.text.redact import redact_argv

if TYPE_CHECKING:
    from gpudiag.agent.base.config import Settings
    from gpudiag.agent.output.result import SessionResult
    from gpudiag.analyzers import Analysis

SCHEMA_VERSION = "1.0"
MAX_REPORT_BYTES = 64 * 1024 * 1024  # reports are kilobytes; refuse to load a runaway file


def tool_version() -> str:
    """gpudiag's installed version."""
    from importlib import metadata

    try:
        return metadata.version("gpudiag")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def schema_text() -> str:
    """The report's JSON Schema, as shipped in the package."""
    return resources.files("gpudiag.agent.output").joinpath("report.schema.json").read_text()


@lru_cache(maxsize=1)
def schema() -> dict:
    """The report's JSON Schema as a dict."""
    return json.loads(schema_text())


def iso(t: float | None) -> str | None:
    """ISO 8601 UTC text for a Unix time."""
    if t is None:
        return None
    try:
        return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):  # a time no clock can show (bad recording)
        return None


@dataclass(frozen=True)
class RunInfo:
    """What the session knows of the run a report is about: how it was profiled (`mode`), the
    command (redacted in the report), the pid, its start and end (Unix times), why it ended,
    the job's exit code, where the settings came from, and the agent's own cost and effective
    sampling rates (Governor.summary())."""

    mode: str
    command: list[str] | None
    pid: int | None
    start: float
    end: float | None
    end_reason: str
    exit_code: int | None = None
    settings_source: str | None = None
    agent: dict | None = None


def build_report(
    *,
    analysis: Analysis,
    run_info: RunInfo,
    environment: dict,
    probes: list[ProbeStatus],
    errors: list[dict],
    thresholds: Thresholds,
) -> dict:
    """Assemble a report document from an analysis and what the session knows."""
    r = run_info
    metrics = {k: (None if v is None else round(float(v), 6)) for k, v in analysis.metrics.items()}
    run: dict[str, Any] = {
        "mode": r.mode,
        "command": redact_argv(r.command),  # secrets never reach a report
        "pid": r.pid,
        "start": iso(r.start),
        "end": iso(r.end),
        "duration_s": round(max(0.0, (r.end or r.start) - r.start), 3),
        "end_reason": r.end_reason,
        "exit_code": r.exit_code,
        "settings_source": r.settings_source,
    }
    if r.agent is not None:
        run["agent"] = r.agent
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "gpudiag", "version": tool_version()},
        "run": run,
        "environment": environment,
        "probes": [p.to_dict() for p in probes],
        "metrics": metrics,
        "metric_units": {k: metric_unit(k) for k in metrics},
        "breakdown": analysis.breakdown.to_dict(),
        "phases": analysis.phases,
        "verdict": analysis.verdict,
        "periods": analysis.periods,
        "critical_path": (
            analysis.critical_path.to_dict()
            if analysis.critical_path and analysis.critical_path.gpu_idle is not None
            else None
        ),
        "findings": [f.to_dict() for f in analysis.findings],
        "cost": analysis.cost or {"available": False, "reason": "not analysed"},
        "thresholds": thresholds.to_dict(),
        "errors": errors,
    }
    if analysis.workload is not None:
        doc["workload"] = analysis.workload.to_dict()
    if analysis.right_size:
        doc["right_size"] = analysis.right_size
    if analysis.compute:
        doc["compute"] = analysis.compute
    if analysis.compute_stacks:
        doc["compute_stacks"] = analysis.compute_stacks
    return doc


def report_of(
    result: SessionResult,
    *,
    mode: str,
    command: list[str] | None,
    pid: int | None,
    settings: Settings,
    environment: dict | None = None,
) -> dict:
    """The report of a session's result: finished, so far (`Session.result_so_far`) or
    replayed from a recording. `environment` defaults to this machine's, with the hardware
    the probes described."""
    if environment is None:
        environment = describe_environment(pid, result.hardware)
    run_info = RunInfo(
        mode,
        command,
        pid,
        result.start,
        result.end,
        result.end_reason,
        result.exit_code,
        settings.source,
        result.agent,
    )
    doc = build_report(
        analysis=result.analysis,
        run_info=run_info,
        environment=environment,
        probes=result.probes,
        errors=result.errors,
        thresholds=settings.thresholds,
    )
    if result.distributed:
        doc.update(result.distributed)  # a multi-rank job: `ranks` and `distributed`
    from gpudiag.agent.output.evidence import add_evidence_views

    return add_evidence_views(
        doc, result.timeline, settings.rules, result.analysis.profile.thread, settings.thresholds
    )


@lru_cache(maxsize=1)
def _validator():
    """The schema's validator, the schema itself checked once (not at every validation)."""
    import jsonschema  # on first use: `gpudiag mcp` and --help start without it

    cls = jsonschema.validators.validator_for(schema())
    cls.check_schema(schema())
    return cls(schema())


def validate(doc: dict) -> None:
    """Raise jsonschema.ValidationError when a document does not match the schema (the most
    relevant error, as jsonschema.validate raises)."""
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator().iter_errors(doc))
    if error is not None:
        raise error


# what reading a field of an unexpected type raises (a crafted report that passes the schema)
READ_ERRORS = (
    KeyError,
    TypeError,
    ValueError,
    AttributeError,
    IndexError,
    OverflowError,
    ZeroDivisionError,
)


@contextmanager
def reading(source: str) -> Iterator[None]:
    """Showing, merging or comparing reports read from files (`source` names them): a field
    of a type gpudiag never writes (a schema-valid crafted report: a share that is a string,
    a list of strings where GPUs stand) is one line naming the file and the field's trouble,
    exit 2, never an internal error. gpudiag's own fresh reports are not read through here,
    so a bug of its own still shows as one."""
    try:
        yield
    except READ_ERRORS as exc:
        what = f"{type(exc).__name__}: {str(exc)[:80]}"
        raise UsageError(
            f"{source}: a field holds a value of a type gpudiag does not write ({what})"
        ) from None


def write_report(doc: dict, path: str | os.PathLike) -> Path:
    """Validate, then write atomically and privately (safeio.atomic_write); non-finite
    numbers are written as null."""
    doc = cast(dict, finite(doc))
    validate(doc)
    atomic_write(path, dumps_json(doc, indent=2) + "\n", what="report")
    return Path(path).resolve()


def check_writable(path: str | os.PathLike) -> None:
    """Fail early, before profiling, when the report could not be written there."""
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"--out {path} is a directory; give a file name")
    if not folder.is_dir():
        raise UsageError(f"cannot write report: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"cannot write report: no permission to write in {folder}")


def check_outputs(named: dict[str, str | None]) -> None:
    """Fail early when an output (option -> path) could not be written, or two name one
    file."""
    for path in named.values():
        if path:
            check_writable(path)
    check_distinct(named)


def load_report(path: str) -> dict:
    """Read and validate a saved report; UsageError with one readable line otherwise."""
    data = read_bounded(path, MAX_REPORT_BYTES, "report file")
    doc = parse_json(data, path, kind="a gpudiag report")
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise UsageError(f"{path} is not a gpudiag report (no schema_version)")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(
            f"{path} has report schema {doc.get('schema_version')!r}; this gpudiag "
            f"reads {SCHEMA_VERSION!r}"
        )
    import jsonschema

    try:
        validate(doc)
    except RecursionError:
        raise UsageError(f"{path} is not a valid gpudiag report: nested too deeply") from None
    except jsonschema.ValidationError as exc:
        where = "/".join(str(x) for x in exc.absolute_path) or "(top level)"
        raise UsageError(
            f"{path} is not a valid gpudiag report: at {where}: {exc.message[:200]}"
        ) from None
    return doc


def default_report_name(pid: int | None, when: float) -> str:
    """gpudiag-<pid>-<YYYYmmdd-HHMMSS>.json in the current folder."""
    stamp = datetime.fromtimestamp(when).strftime("%Y%m%d-%H%M%S")
    return f"gpudiag-{pid if pid is not None else 'run'}-{stamp}.json"
