"""End to end: outbound text through one sink: the summary, markdown, the watch log and the report
TUI never carry a job's escapes, secrets or markup, and gpudiag's own text is kept."""

from __future__ import annotations

import asyncio
import json

from tests.agent.test_outbound_sink import EVIL, _evil_doc


def test_markup_in_any_report_field_does_not_crash_report_tui():
    """A report title holding `[/x]` crashed `gpudiag report --tui` (Rich markup)."""
    from gpudiag.tui.app import DiagnosisApp
    from gpudiag.tui.feeds import static_feed
    from gpudiag.tui.screens import FindingScreen
    from gpudiag.tui.widgets import FindingsTable

    doc = _evil_doc()
    doc["run"]["pid"] = "[/pid]"
    app = DiagnosisApp(static_feed(doc, f"report [/file].json{EVIL}"))

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            row = " ".join(str(c) for c in app.screen.query_one(FindingsTable).get_row_at(0))
            assert "[/x] [bold]title" in row
            await pilot.press("enter")
            await pilot.pause()
            assert isinstance(app.screen, FindingScreen)
            await pilot.press("escape", "question_mark")
            await pilot.pause()
            await pilot.press("q")

    asyncio.run(go())
    json.dumps(doc)  # the document itself is untouched
