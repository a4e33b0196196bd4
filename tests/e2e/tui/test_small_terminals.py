"""End to end: the diagnosis view at 80x24 and 100x30: the findings table fits, values keep their
units, names are not cut in the middle, and a saved report offers only keys that do something."""

from __future__ import annotations

import asyncio

import pytest

from gpudiag.tui.app import DiagnosisApp
from gpudiag.tui.feeds import Feed, static_feed
from gpudiag.tui.screens import HelpScreen
from gpudiag.tui.widgets import FindingsTable
from tests.tui.snapshot_apps import scenario

SMALL = pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=["80x24", "100x30"])


def run(app: DiagnosisApp, steps, size):
    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await steps(pilot)

    asyncio.run(go())


@SMALL
@pytest.mark.parametrize("name", ["starved", "two_gpus", "hooked"])
def test_findings_table_shows_id_title_impact_speedup_within_the_screen(name, size):
    doc = scenario(name)
    app = DiagnosisApp(static_feed(doc, "report"), clock=False)

    async def steps(pilot):
        table = app.screen.query_one(FindingsTable)
        labels = [str(c.label) for c in table.columns.values()]
        assert labels[0] == "id" and labels[-3:] == ["finding", "impact", "speed-up"]
        used = sum(c.get_render_width(table) for c in table.columns.values())
        assert used <= table.size.width and table.region.right <= size[0]
        title_w = list(table.columns.values())[-3].width
        for row, f in enumerate(doc["findings"]):
            title = str(table.get_cell_at((row, len(labels) - 3)))
            assert len(title) <= title_w
            assert title == f["title"] or (
                title.endswith("…") and f["title"].startswith(title[:-1])
            )
            assert str(table.get_cell_at((row, len(labels) - 2))) == f"{f['impact']:.0%}"
        if name == "starved":  # the long DATA001 title is shortened, not cut off silently
            assert str(table.get_cell_at((0, len(labels) - 3))).endswith("…") or size[0] > 90

    run(app, steps, size)


def shown_keys(app) -> set[str]:
    return {k for k, b in app.screen.active_bindings.items() if b.binding.show}


@SMALL
def test_saved_report_does_not_offer_save_or_pause(size):
    app = DiagnosisApp(static_feed(scenario("starved"), "report"), clock=False)

    async def steps(pilot):
        assert shown_keys(app) == {"q", "question_mark"}
        await pilot.press("s", "p")  # nothing happens, nothing claims to
        await pilot.pause()
        assert "saved" in app.status_line() and "paused" not in app.status_line()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        help_text = str(app.screen.query_one("#help").render())
        assert "save the report" not in help_text and "pause" not in help_text

    run(app, steps, size)


@SMALL
def test_live_view_offers_save_and_pause(size):
    doc = scenario("starved")
    feed = Feed(
        "live",
        lambda: doc,
        live=True,
        save=lambda: "/tmp/r.json",
        pause=lambda paused: None,
        stop=lambda: None,
    )
    app = DiagnosisApp(feed, clock=False)

    async def steps(pilot):
        assert {"q", "s", "p", "question_mark"} <= shown_keys(app)
        await pilot.press("question_mark")
        await pilot.pause()
        help_text = str(app.screen.query_one("#help").render())
        assert "save the report now" in help_text and "pause / resume" in help_text

    run(app, steps, size)
