"""Pilot tests of the terminal UI over saved reports and a live-like feed."""

from __future__ import annotations

import asyncio
import time

from gpudiag.agent.output.report import RunInfo, build_report
from gpudiag.analyzers import analyze
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.tui.app import DiagnosisApp
from gpudiag.tui.feeds import Feed, static_feed
from gpudiag.tui.screens import DiagnosisScreen, FindingScreen, HelpScreen, Shown
from gpudiag.tui.widgets import FindingsTable
from tests.analyzers.test_cost import QUARTER_BUSY_9GIB
from tests.analyzers.test_gpu_findings import STARVED, timeline


def starved_doc() -> dict:
    now = time.time()
    return build_report(
        analysis=analyze(timeline(QUARTER_BUSY_9GIB, shares=STARVED).tl),
        run_info=RunInfo(
            "run", ["python", "train.py"], 42, now - 15, now, "duration_reached", None
        ),
        environment={"host": "h", "cpu_count": 16, "python": "3.11"},
        probes=[],
        errors=[],
        thresholds=Thresholds(),
    )


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


def test_metrics_panel_has_one_row_per_rank_with_the_straggler_marked():
    from gpudiag.tui.widgets import metrics_text

    bd = {"data": 0.7, "compute": 0.2, "collectives": 0.1}
    doc = {
        "metrics": {},
        "probes": [],
        "ranks": [
            {"rank": 0, "step_time_s": 0.13, "breakdown": {"collectives": 0.9}, "gpu": "0"},
            {"rank": 1, "step_time_s": 0.13, "breakdown": bd, "gpu": "1"},
        ],
        "distributed": {"straggler": {"straggler": 1}},
    }
    text = metrics_text(doc).plain(80)
    assert "rank 0" in text and "coll 90%" in text
    assert "rank 1 straggler" in text and "data 70%" in text and "GPU 1" in text
    assert "rank" not in metrics_text({"metrics": {}, "probes": []}).plain(80)


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


def test_c_does_nothing_on_a_saved_report():
    app = DiagnosisApp(static_feed(starved_doc(), "report"))
    assert app.check_action("capture", ()) is False


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
