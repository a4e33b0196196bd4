"""The end of a session: its probes closed and drained, then everything analysed."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpudiag.agent.session.setup import SessionResult
from gpudiag.analyzers import analyze
from gpudiag.probes.base import ProbeStatus

if TYPE_CHECKING:
    from gpudiag.agent.session.session import Session


def close_probes(s: Session, reason: str) -> None:
    """Close the session's probes (a hung one is left alone), join their threads, drain the
    buffered ones once more and take their final statuses and problems."""
    s.check_hung()
    live = [p for p in s.probes if p.name not in s.hung]
    for probe in live:  # a hung probe's close() could hang too: left alone
        try:
            probe.close()
        except Exception as exc:
            s.error(probe.name, f"failed to close: {exc}")
    deadline = time.monotonic() + 20
    for th, name in s._threads:  # a hung probe's thread is left to the daemon exit
        if name not in s.hung:
            th.join(timeout=max(0.1, deadline - time.monotonic()))
    for probe in live:
        if probe.buffered and s.statuses.get(probe.name, ProbeStatus(probe.name, False)).available:
            try:
                s._ingest(probe.sample())
            except Exception:
                pass
        for msg in probe.problems():
            s.error(probe.name, msg)
        final = probe.final_status()
        if final is not None and probe.name in s.statuses:
            s.statuses[probe.name] = final
    stacks_ok = s.statuses.get("stacks")
    if stacks_ok is not None and stacks_ok.available and not s.timeline.window_totals("all"):
        s.error(
            "stacks",
            "py-spy returned no stack samples"
            + ("" if reason != "target_exited" else " before the job exited"),
        )


def final_result(s: Session, start: float, reason: str) -> SessionResult:
    """The session's samples analysed (the ranks' findings added) into its result."""
    end = time.time()
    with s._lock:
        analysis = analyze(
            s.timeline,
            s.settings.thresholds,
            s.settings.rules,
            s.settings.price,
            s.settings.price_table,
        )
    analysis, dist = s._with_ranks(analysis)
    statuses = [
        s.statuses.get(p.name) or ProbeStatus(p.name, False, "not started (session ended first)")
        for p in s.probes
    ]
    hardware: dict = {}
    for p in s.probes:
        st = s.statuses.get(p.name)
        if st is not None and st.available:
            hardware.update(p.describe())
    agent = s.governor.summary() if s.governor is not None else None
    return SessionResult(
        analysis,
        statuses,
        s.errors,
        start,
        end,
        reason,
        s.exit_code,
        s.timeline,
        hardware,
        agent,
        dist,
    )
