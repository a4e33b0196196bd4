"""The Textual app, built from a feed: a live session, a saved report or a recording."""

from __future__ import annotations

from typing import Any

from textual.app import App
from textual.binding import Binding
from textual.reactive import reactive
from textual.widgets import DataTable

from gpudiag.text.redact import printable
from gpudiag.tui.feeds import Feed
from gpudiag.tui.offloop import OffLoop
from gpudiag.tui.screens import DiagnosisScreen, FindingScreen, HelpScreen, Shown


class DiagnosisApp(App):
    """Live or saved diagnosis of one job. What the diagnosis screen shows is one reactive,
    `shown` (the newest report document, the status line, the job's new output), which the
    screen watches."""

    CSS_PATH = "gpudiag.tcss"
    TITLE = "gpudiag"
    BINDINGS = [
        Binding("q", "quit_feed", "quit"),
        Binding("s", "save", "save report"),
        Binding("p", "pause", "pause"),
        Binding("c", "capture", "capture steps"),
        Binding("question_mark", "help", "help"),
        Binding("enter", "open_finding", "details", show=False),
    ]

    shown: reactive[Shown | None] = reactive(None, always_update=True)

    def __init__(self, feed: Feed, clock: bool = True) -> None:
        super().__init__()
        self.feed = feed
        self.clock = clock
        self.doc: dict | None = None
        self.paused = False
        self.message = ""
        self._snapshots = OffLoop(self, feed.snapshot, self._arrived)  # live: off the loop

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Save and pause only where the feed can do them (a live session), so a saved
        report's footer and help do not offer keys that do nothing."""
        if action == "save":
            return self.feed.save is not None
        if action == "pause":
            return self.feed.pause is not None
        if action == "capture":
            return self.feed.capture is not None
        return True

    def on_mount(self) -> None:
        self.sub_title = printable(self.feed.title)
        feed = self.feed
        self.push_screen(DiagnosisScreen(self.clock, feed.output is not None, feed.output_path))
        if self.feed.live:
            self.set_interval(1.0, self.refresh_feed)

    def take_output(self) -> list[str]:
        """The job's output lines the log panel has not shown yet (its last 2,000)."""
        return self.feed.output()[-2000:] if self.feed.output is not None else []

    def on_diagnosis_screen_wanted(self, message: DiagnosisScreen.Wanted) -> None:
        self.refresh_feed()

    def refresh_feed(self) -> None:
        """Show the newest report document. A live feed's snapshot (an analysis of what was
        collected so far) runs on a worker thread, one at a time, so the event loop keeps
        drawing and taking keys; the screen updates when it arrives."""
        if not self.feed.live:
            self._arrived(self.feed.snapshot())
            return
        self._show()
        self._snapshots.request()

    def _arrived(self, doc: dict | None) -> None:
        if doc is not None:
            self.doc = doc
        self._show()

    def _show(self) -> None:
        self.shown = Shown(self.doc, self.status_line(), tuple(self.take_output()))

    def status_line(self) -> str:
        if self.doc is None:
            return "starting…"
        run = self.doc.get("run", {})
        state = "paused" if self.paused else ("live" if self.feed.live else "saved")
        ended = self.feed.ended() if self.feed.ended is not None else None
        if ended:
            state = ended
        n = len(self.doc.get("findings", []))
        extra = f" · {self.message}" if self.message else ""
        return (
            f"{state} · pid {run.get('pid')} · {run.get('duration_s', 0):.0f} s · "
            f"{n} finding{'s' if n != 1 else ''}{extra}"
        )

    def action_open_finding(self) -> None:
        if not isinstance(self.screen, DiagnosisScreen) or not self.doc:
            return
        findings = self.doc.get("findings", [])
        table = self.screen.query_one("#findings", DataTable)
        if findings and 0 <= table.cursor_row < len(findings):
            self.push_screen(FindingScreen(findings[table.cursor_row]))

    def on_data_table_row_selected(self, event: Any) -> None:
        self.action_open_finding()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(lambda a: self.check_action(a, ()) is not False))

    def action_save(self) -> None:
        if self.feed.save is None:
            self.message = "this view has nothing new to save"
        else:
            self.message = f"saved {self.feed.save()}"
        self.refresh_feed()

    def action_pause(self) -> None:
        if self.feed.pause is None:
            return
        self.paused = not self.paused
        self.feed.pause(self.paused)
        self.refresh_feed()

    def action_capture(self) -> None:
        if self.feed.capture is not None:
            self.message = self.feed.capture()
            self.refresh_feed()

    def action_quit_feed(self) -> None:
        if self.feed.stop is not None:
            self.feed.stop()
        self.exit()
