"""`gpudiag top`: GPU and host panels and a process table; `a` attaches to a Python process
(after a question: load the in-process hooks too, `y`, or only read it, `n`)."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Static

from gpudiag.text.redact import printable, shown
from gpudiag.tui.offloop import OffLoop

COMMAND_CHARS = 120  # of a process's command line, after its secrets are hidden

SPARK = " ▁▂▃▄▅▆▇█"


def spark(values: list[float]) -> str:
    """A one-line history of shares in [0, 1]."""
    return "".join(SPARK[min(8, int(v * 8.999))] for v in values[-30:])


def gpu_text(box: dict) -> Text:
    """One block per GPU: utilisation with history, VRAM, PCIe, clocks, power, temperature."""
    t = Text()
    status = box.get("gpu_status", {})
    if not status.get("available"):
        t.append("No NVIDIA GPU: ", style="bold")
        t.append(f"{status.get('reason')}\n")
        if status.get("hint"):
            t.append(f"fix: {status['hint']}\n")
        t.append("Host panel and Python processes below still work.\n")
        return t
    for g in box.get("gpus", []):
        t.append(f"GPU {g['index']} {g.get('name') or ''}\n", style="bold")
        util = g.get("util_gpu")
        t.append(
            f"  util {util:.0%} {spark(g.get('history', []))}" if util is not None else "  util n/a"
        )
        if g.get("gpm_sm_active") is not None:
            t.append(f"  SM active {g['gpm_sm_active']:.0%}")
        t.append("\n")
        if g.get("mem_total_bytes"):
            t.append(
                f"  VRAM {g['mem_used_bytes'] / 2**30:.1f}/{g['mem_total_bytes'] / 2**30:.0f} GiB"
            )
        if g.get("pcie_rx_bytes_per_s") is not None:
            t.append(
                f"  PCIe rx {g['pcie_rx_bytes_per_s'] / 1e9:.2f} GB/s tx "
                f"{(g.get('pcie_tx_bytes_per_s') or 0) / 1e9:.2f} GB/s"
                f" (gen{g.get('pcie_gen', 0):.0f} x{g.get('pcie_width', 0):.0f})"
            )
        t.append("\n")
        if g.get("sm_clock_mhz") is not None:
            t.append(f"  SM {g['sm_clock_mhz']:.0f}/{g.get('sm_clock_max_mhz') or 0:.0f} MHz")
        held = [
            k[len("throttle_") :]
            for k, v in g.items()
            if k.startswith("throttle_") and v and v >= 0.5
        ]
        if held:
            t.append(f"  throttled: {', '.join(held)}", style="bold red")
        if g.get("power_w") is not None:
            t.append(f"  {g['power_w']:.0f}/{g.get('power_limit_w') or 0:.0f} W")
        if g.get("temperature_c") is not None:
            t.append(f"  {g['temperature_c']:.0f} °C")
        t.append("\n")
    return t


def host_text(box: dict) -> Text:
    """CPU, iowait, pressure, memory and swap."""
    h = box.get("host", {})
    t = Text()
    t.append("Host  ", style="bold")
    if h.get("cpu_util") is not None:
        t.append(
            f"CPU {h['cpu_util']:.0%} of {h.get('cpu_count', 0):.0f} cores · iowait "
            f"{h.get('cpu_iowait', 0):.0%}"
        )
    if h.get("psi_io_some") is not None:
        t.append(
            f" · PSI cpu {h.get('psi_cpu_some', 0):.0%} io {h['psi_io_some']:.0%} "
            f"mem {h.get('psi_memory_some', 0):.0%}"
        )
    if h.get("mem_total_bytes"):
        used = h["mem_total_bytes"] - h.get("mem_available_bytes", 0)
        t.append(f" · RAM {used / 2**30:.1f}/{h['mem_total_bytes'] / 2**30:.0f} GiB")
    if h.get("swap_in_bytes_per_s"):
        t.append(f" · swap-in {h['swap_in_bytes_per_s'] / 1e6:.1f} MB/s", style="bold red")
    return t


class TopApp(App):
    """The box view. Exits with (pid, load the hooks) once `a` is pressed and answered."""

    CSS_PATH = "gpudiag.tcss"
    TITLE = "gpudiag top"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("a", "attach", "attach & diagnose"),
        Binding("question_mark", "help", "help"),
        Binding("y", "answer(True)", "load the hooks", show=False),
        Binding("n", "answer(False)", "read only", show=False),
        Binding("escape", "answer(None)", "cancel", show=False),
    ]

    def __init__(self, snapshot: Callable[[], dict]) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.box: dict = {}
        self._samples = OffLoop(self, snapshot, self.show)  # NVML and psutil off the loop
        self.asking: int | None = None  # `a` pressed on this pid: waiting for y / n / esc

    def compose(self) -> ComposeResult:
        yield Header(show_clock=True)
        yield Static(id="gpus", markup=False)
        yield Static(id="host", markup=False)
        yield DataTable(id="procs", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#procs", DataTable).add_columns(
            "pid", "user", "GPU:VRAM", "CPU %", "RSS", "command"
        )
        self.tick()
        self.set_interval(1.0, self.tick)

    def tick(self) -> None:
        """Sample on a worker thread (NVML and the process table take time), one at a time;
        the panels update when the sample arrives, so keys never wait on it."""
        self._samples.request()

    def show(self, box: dict | None) -> None:
        """Draw the panels and the process table from one sample."""
        if box is None:
            return
        self.box = box
        self.query_one("#gpus", Static).update(gpu_text(self.box))
        self.query_one("#host", Static).update(host_text(self.box))
        table = self.query_one("#procs", DataTable)
        row = table.cursor_row
        selected = self.selected_pid()
        table.clear()
        pids = []
        for p in self.box.get("processes", []):
            table.add_row(  # Text cells: `[/x]` in another user's argv is not markup
                str(p["pid"]),
                Text(printable(str(p["user"]))),
                Text(printable(str(p["gpus"]))),
                f"{p['cpu']:.0f}",
                f"{p['rss'] / 2**20:.0f} MiB",
                Text(shown(str(p["command"]), limit=4 * COMMAND_CHARS)[:COMMAND_CHARS]),
                key=str(p["pid"]),
            )
            pids.append(p["pid"])
        if table.row_count:  # the selection follows the process, not the row number
            table.move_cursor(
                row=pids.index(selected) if selected in pids else min(row, table.row_count - 1)
            )
        self._shown = pids

    def selected_pid(self) -> int | None:
        """The pid under the cursor, as last shown."""
        shown = getattr(self, "_shown", [])
        row = self.query_one("#procs", DataTable).cursor_row
        return shown[row] if 0 <= row < len(shown) else None

    def action_attach(self) -> None:
        pid = self.selected_pid()
        p = next((p for p in self.box.get("processes", []) if p["pid"] == pid), None)
        if p is not None:
            if not p["python"]:
                self.notify("not a Python process: gpudiag attaches to Python jobs")
                return
            self.asking = p["pid"]
            self.notify(
                f"attach to pid {p['pid']}: also load gpudiag's hooks into it (exact steps/s "
                "and data wait; pyinjector, gdb or sys.remote_exec)? y: yes · n: only read it "
                "· esc: cancel",
                timeout=30,
            )

    def action_answer(self, hooks: bool | None) -> None:
        """The answer to `a`'s question: attach with or without the hooks, or not at all."""
        pid, self.asking = self.asking, None
        if pid is not None and hooks is not None:
            self.exit((pid, hooks))

    def action_help(self) -> None:
        self.notify(
            "↑/↓ select a process · a attach and diagnose it (y: with the hooks) · q quit",
            timeout=6,
        )
