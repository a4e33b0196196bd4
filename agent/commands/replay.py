"""`gpudiag replay`: a recording run through the analyzers into the report the live run
would have written."""

from __future__ import annotations

import jsonschema

from gpudiag.agent.cli.config import Settings
from gpudiag.agent.cli.errors import UsageError
from gpudiag.agent.output.recording import open_recording
from gpudiag.agent.output.report import report_of, validate
from gpudiag.agent.session.environment import describe_environment
from gpudiag.agent.session.session import SessionResult
from gpudiag.analyzers import analyze


def replay_report(path: str, settings: Settings) -> dict:
    """The report of the recording at `path`, analysed with `settings`."""
    rec = open_recording(path)
    tl = rec.timeline()  # a stream: the file is never held in memory
    analysis = analyze(
        tl, settings.thresholds, settings.rules, settings.price, settings.price_table
    )
    foot = rec.footer or {}
    run = rec.header.get("run", {})
    errors = list(foot.get("errors", []))
    if rec.footer is None:
        errors.append(
            {
                "source": "replay",
                "message": "recording was cut short (no footer): probe status unknown",
                "t": None,
            }
        )
    result = SessionResult(
        analysis,
        rec.probes,
        errors,
        start=foot.get("start") or (tl.start_ns or 0) / 1e9,
        end=foot.get("end") or (tl.end_ns or 0) / 1e9,
        end_reason="replayed",
        exit_code=foot.get("exit_code"),
        timeline=tl,
        agent=foot.get("agent"),
    )
    environment = (
        foot.get("environment") or rec.header.get("environment") or describe_environment(None)
    )
    doc = report_of(
        result,
        mode="replay",
        command=run.get("command"),
        pid=run.get("pid"),
        settings=settings,
        environment=environment,
    )
    try:
        validate(doc)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(x) for x in exc.absolute_path) or "(top level)"
        raise UsageError(
            f"{path}: the recording's header or footer is malformed (report {where}: "
            f"{exc.message[:120]})"
        ) from None
    return doc
