"""Screens: the diagnosis view, a finding's detail, and help."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Header, Log, Static

from gpudiag.text.formatting import evidence_parts, is_bound, speedup_text
from gpudiag.text.redact import printable
from gpudiag.text.trials import summary_line, with_trials
from gpudiag.tui.widgets import BreakdownBar, FindingsTable, metrics_text
from gpudiag.tui.wrap import Wrapped


@dataclass(frozen=True)
class Shown:
    """What the diagnosis screen shows, as one value: the newest report document (None
    before the first), the status line, and the job's output lines new since the last. The
    app holds it in one reactive (`DiagnosisApp.shown`) that the screen watches."""

    doc: dict | None
    status: str
    output: tuple[str, ...] = ()


class DiagnosisScreen(Screen):
    """Breakdown, findings ranked by impact, and the numbers behind them; it watches the
    app's `shown` and asks for the newest (`Wanted`) when it is shown."""

    class Wanted(Message):
        """The screen is shown (mounted, or back from another screen): the newest report
        document is wanted."""

    def __init__(
        self, clock: bool = True, output: bool = False, output_path: str | None = None
    ) -> None:
        """`clock` in the header; `output`: a log panel for the job's output (a copy of it
        in `output_path`)."""
        super().__init__()
        self.clock = clock
        self.output = output
        self.output_path = output_path

    def compose(self) -> ComposeResult:
        yield Header(show_clock=self.clock)
        yield Static(id="status", markup=False)
        yield BreakdownBar(id="breakdown")
        with Horizontal(id="body"):
            yield FindingsTable(id="findings")
            yield Static(id="metrics", markup=False)
        if self.output:
            log = Log(id="joblog", max_lines=2000)
            where = f" (also in {self.output_path})" if self.output_path else ""
            log.border_title = f"job output{where}"
            yield log
        yield Footer()

    NARROW = 120  # below this width the numbers go under the findings, full width

    def on_mount(self) -> None:
        self.set_class(self.app.size.width < self.NARROW, "narrow")
        self.watch(self.app, "shown", self.show)
        self.post_message(self.Wanted())

    def on_resize(self, event: Any) -> None:
        self.set_class(event.size.width < self.NARROW, "narrow")

    def on_screen_resume(self) -> None:
        self.post_message(self.Wanted())

    def show(self, shown: Shown | None) -> None:
        """Refresh every widget from what the app shows."""
        if shown is None:
            return
        self.query_one("#status", Static).update(printable(shown.status))
        if shown.output:
            self.query_one("#joblog", Log).write_lines(list(shown.output))
        doc = shown.doc
        if doc is None:
            return
        self.query_one(BreakdownBar).show(doc.get("breakdown"))
        self.query_one(FindingsTable).show(with_trials(doc) if doc.get("findings") else [])
        self.query_one("#metrics", Static).update(metrics_text(doc))


def finding_text(f: dict) -> Wrapped:
    """A finding's message, evidence with thresholds, fix with values, location, cost."""
    t = Wrapped()
    t.para(f"{f['id']}  {f['title']}", style="bold")
    t.row(
        "",
        [
            f["severity"],
            f"impact {f['impact']:.0%} of wall time",
            f"{'speed-up bound' if is_bound(f) else 'expected speed-up'} {speedup_text(f)}",
            f"confidence {f['confidence']:.0%}",
        ],
        label_width=0,
    ).blank()
    t.para(f["message"]).blank()
    if f.get("speedup_basis"):
        t.para(f["speedup_basis"], lead="Speed-up: ").blank()
    if f.get("location"):
        t.para(f["location"], lead="Where: ").blank()
    t.para(f["recommendation"]["summary"], lead="Fix: ")
    for a in f["recommendation"]["actions"]:
        t.para(a, lead="  • ", lead_style="")
    if f.get("trial"):
        t.blank().para(summary_line(f["trial"]), lead="Tried: ")
        t.para(f["trial"].get("change") or "", lead="Change: ")
    t.blank().para("Evidence", style="bold")
    label_w = min(36, max((len(e["metric"]) for e in f["evidence"]), default=0) + 4)
    for e in f["evidence"]:
        t.row(f"  {e['metric']}", evidence_parts(e, with_metric=False), label_width=label_w)
    if f.get("cost") and "usd_per_day" in f["cost"]:
        t.blank().para(f"Cost: ${f['cost']['usd_per_day']:,.0f}/day", style="bold")
    return t


class FindingScreen(Screen):
    """One finding in full."""

    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "back")]

    def __init__(self, finding: dict) -> None:
        super().__init__()
        self.finding = finding

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(finding_text(self.finding), id="detail", markup=False)
        yield Footer()


HELP_KEYS = [
    (None, "↑/↓", "move between findings"),
    (None, "Enter", "open a finding: evidence, the fix, the code location"),
    (None, "Esc", "back"),
    ("save", "s", "save the report now"),
    ("pause", "p", "pause / resume sampling"),
    ("capture", "c", "profiler capture of 10 steps in the job (needs the hooks)"),
    (None, "q", "quit (a live view writes the report first)"),
    (None, "?", "this help"),
]


def help_text(enabled: Any) -> str:
    """The keys this view offers (`enabled(action)` says whether it does anything here)."""
    keys = [
        f"  {key:<10} {what}"
        for action, key, what in HELP_KEYS
        if action is None or enabled(action)
    ]
    return (
        "gpudiag — why the job is slow and what to change\n\n"
        + "\n".join(keys)
        + "\n\nThe bar shows where the training loop's wall time goes; findings are ranked "
        "by the share of wall time they cost (impact).\n"
    )


class HelpScreen(ModalScreen):
    """Keys and what the view shows (`enabled(action)`: whether a key's action does anything
    in this view)."""

    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close")]

    def __init__(self, enabled: Callable[[str], bool]) -> None:
        super().__init__()
        self.enabled = enabled

    def compose(self) -> ComposeResult:
        yield Static(help_text(self.enabled), id="help", markup=False)
