"""End to end: pilot tests of the terminal UI over saved reports and a live-like feed."""

from __future__ import annotations

import asyncio

from gpudiag.tui.app import DiagnosisApp
from gpudiag.tui.feeds import Feed, static_feed
from gpudiag.tui.screens import DiagnosisScreen, FindingScreen, HelpScreen, Shown
from gpudiag.tui.widgets import FindingsTable
from tests.tui.test_app import starved_doc


def run(app: DiagnosisApp, steps, size=(80, 24)):
    async def go():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await steps(pilot)

    asyncio.run(go())


def text_of(widget) -> str:
    return str(widget.render())


def test_findings_are_listed_by_impact_and_enter_opens_the_detail():
    doc = starved_doc()
    app = DiagnosisApp(static_feed(doc, "report"))

    async def steps(pilot):
        table = app.screen.query_one(FindingsTable)
        assert table.row_count == len(doc["findings"]) and doc["findings"][0]["id"] == "DATA001"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FindingScreen)
        detail = text_of(app.screen.query_one("#detail"))
        assert "num_workers=" in detail and "data_wait_warn" in detail
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, DiagnosisScreen)
        await pilot.press("down", "enter")
        await pilot.pause()
        assert app.screen.finding["id"] == doc["findings"][1]["id"]

    run(app, steps)


def test_help_and_quit_keys():
    app = DiagnosisApp(static_feed(starved_doc(), "report"))

    async def steps(pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("q")
        await pilot.pause()

    run(app, steps, size=(160, 48))
    assert app.return_code in (0, None)


def test_live_feed_refreshes_saves_pauses_and_stops():
    docs = [None, starved_doc()]
    calls = {"save": 0, "stop": 0, "pause": []}

    def snapshot():
        return docs[min(len(docs) - 1, calls.setdefault("n", 0))]

    def save():
        calls["save"] += 1
        return "/tmp/r.json"

    feed = Feed(
        "run pid 42",
        snapshot,
        live=True,
        save=save,
        pause=lambda p: calls["pause"].append(p),
        stop=lambda: calls.__setitem__("stop", calls["stop"] + 1),
    )
    app = DiagnosisApp(feed)

    async def steps(pilot):
        assert "starting" in text_of(app.screen.query_one("#status"))
        calls["n"] = 1
        await pilot.pause(1.3)  # the view refreshes at least once a second
        assert "DATA001" in str(app.screen.query_one(FindingsTable).get_row_at(0))
        await pilot.press("s", "p")
        await pilot.pause()
        assert calls["save"] == 1 and calls["pause"] == [True]
        assert "paused" in text_of(app.screen.query_one("#status"))
        await pilot.press("q")

    run(app, steps)
    assert calls["stop"] == 1


def test_c_asks_a_live_job_for_a_capture_and_says_so():
    asked = []

    def capture() -> str:
        asked.append(1)
        return "capture of 10 steps asked for"

    doc = starved_doc()
    app = DiagnosisApp(Feed("run pid 1", lambda: doc, live=True, capture=capture), clock=False)

    async def steps(pilot):
        await pilot.press("c")
        await pilot.pause()
        assert asked == [1]
        assert "capture of 10 steps asked for" in app.status_line()

    run(app, steps)


def test_a_slow_live_analysis_does_not_stop_the_view():
    """A live snapshot (an analysis of the session so far) runs on a worker thread: while
    one takes seconds, keys are handled and the job's output still reaches the log panel;
    only one analysis runs at a time, and its result is shown when it arrives."""
    import threading

    from textual.widgets import Log

    doc = starved_doc()
    release, calls, lines = threading.Event(), {"n": 0}, ["step 1 loss 0.1"]

    def snapshot():
        calls["n"] += 1
        release.wait(20)
        return doc

    def output():
        out, lines[:] = list(lines), []
        return out

    feed = Feed("run pid 42", snapshot, live=True, output=output)
    app = DiagnosisApp(feed)

    async def steps(pilot):
        await pilot.pause(1.5)  # two refresh ticks while the first analysis is stuck
        assert calls["n"] == 1  # never queued behind the stuck one
        assert "starting" in text_of(app.screen.query_one("#status"))
        joblog = app.screen.query_one("#joblog", Log)
        assert any("step 1 loss" in str(line) for line in joblog.lines)
        await pilot.press("question_mark")  # the event loop takes keys meanwhile
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        release.set()
        for _ in range(30):
            await pilot.pause(0.1)
            if app.doc is not None:
                break
        assert app.doc is doc
        assert "DATA001" in str(app.screen.query_one(FindingsTable).get_row_at(0))
        await pilot.press("q")

    run(app, steps, size=(100, 30))


def test_the_diagnosis_screen_shows_what_the_apps_one_reactive_holds():
    """The screen watches `DiagnosisApp.shown` (document, status line, new output lines); it
    reads nothing else of the app."""
    doc = starved_doc()
    app = DiagnosisApp(static_feed(doc, "report"), clock=False)

    async def steps(pilot):
        assert isinstance(app.shown, Shown) and app.shown.doc is doc
        app.shown = Shown(doc, "a status of its own")
        await pilot.pause()
        assert text_of(app.screen.query_one("#status")) == "a status of its own"
        assert "DATA001" in str(app.screen.query_one(FindingsTable).get_row_at(0))

    run(app, steps)


def test_two_findings_with_one_id_are_both_listed():
    """N05: a crafted report with a duplicated finding made `report --tui` exit on
    DuplicateKey."""
    doc = starved_doc()
    doc["findings"] = [doc["findings"][0], dict(doc["findings"][0])]
    app = DiagnosisApp(static_feed(doc, "report"))

    async def steps(pilot):
        table = app.screen.query_one(FindingsTable)
        assert table.row_count == 2
        await pilot.press("down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, FindingScreen)

    run(app, steps)
