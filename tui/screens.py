"""Screens: the diagnosis view, a finding's detail, and help."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Header, Static

from gpudiag.tui.widgets import BreakdownBar, FindingsTable, metrics_text


class DiagnosisScreen(Screen):
    """Breakdown, findings ranked by impact, and the numbers behind them."""

    def compose(self) -> ComposeResult:
        yield Header(show_clock=getattr(self.app, "clock", True))
        yield Static(id="status")
        yield BreakdownBar(id="breakdown")
        with Horizontal(id="body"):
            yield FindingsTable(id="findings")
            yield Static(id="metrics")
        yield Footer()

    def on_mount(self) -> None:
        self.app.refresh_feed()

    def on_screen_resume(self) -> None:
        self.app.refresh_feed()

    def show(self, doc: dict | None, status: str) -> None:
        """Refresh every widget from a report document."""
        self.query_one("#status", Static).update(status)
        if doc is None:
            return
        self.query_one(BreakdownBar).show(doc.get("breakdown"))
        self.query_one(FindingsTable).show(doc.get("findings", []))
        self.query_one("#metrics", Static).update(metrics_text(doc))


def finding_text(f: dict) -> Text:
    """A finding's message, evidence with thresholds, fix with values, location, cost."""
    t = Text()
    t.append(f"{f['id']}  {f['title']}\n", style="bold")
    t.append(f"{f['severity']} · impact {f['impact']:.0%} of wall time · expected speed-up "
             f"×{f['expected_speedup']:.2f} · confidence {f['confidence']:.0%}\n\n")
    t.append(f"{f['message']}\n\n")
    if f.get("location"):
        t.append("Where: ", style="bold")
        t.append(f"{f['location']}\n\n")
    t.append("Fix: ", style="bold")
    t.append(f"{f['recommendation']['summary']}\n")
    for a in f["recommendation"]["actions"]:
        t.append(f"  • {a}\n")
    t.append("\nEvidence\n", style="bold")
    for e in f["evidence"]:
        value = e.get("value")
        unit = e.get("unit", "")
        shown = "n/a" if value is None else (f"{value:.1%}" if unit == "ratio" else
                                             f"{value:g} {unit}")
        line = f"  {e['metric']:<34} {shown}"
        if e.get("threshold") is not None:
            thr = f"{e['threshold']:.1%}" if unit == "ratio" else f"{e['threshold']:g}"
            line += f"   {e.get('comparison') or ''} {e.get('setting') or 'threshold'} {thr}"
        if e.get("source"):
            line += f"   [{e['source']}]"
        t.append(line + "\n")
    if f.get("cost"):
        t.append(f"\nCost: ${f['cost'].get('usd_per_day', 0):,.0f}/day\n", style="bold")
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
            yield Static(finding_text(self.finding), id="detail")
        yield Footer()


HELP = """\
gpudiag — why the job is slow and what to change

  ↑/↓        move between findings
  Enter      open a finding: evidence, thresholds, the fix, the code location
  Esc        back
  s          save the report now
  p          pause / resume sampling (live views)
  q          quit (a live view writes the report first)
  ?          this help

The bar shows where the training loop's wall time goes; findings are ranked by the share
of wall time they cost (impact).
"""


class HelpScreen(ModalScreen):
    """Keys and what the view shows."""

    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")
