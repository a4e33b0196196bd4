"""Make the README's screenshots from a saved report (the demo's):
    python scripts/docs_screenshots.py gpudiag-demo.json docs/img
writes tui.png (the diagnosis view at 100x30, through Textual's SVG screenshot) and html.png
(the top of the HTML page), both with headless Chromium (`apt-get install chromium`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

from gpudiag.agent.output.render.html import render_html
from gpudiag.agent.output.report import load_report
from gpudiag.tui.app import DiagnosisApp
from gpudiag.tui.feeds import static_feed

SHOT = Path(__file__).with_name("html_screenshot.sh")


async def tui_svg(doc: dict, size: tuple[int, int]) -> str:
    """The diagnosis view of `doc` as Textual's SVG screenshot."""
    app = DiagnosisApp(static_feed(doc, "gpudiag-demo.json"), clock=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.5)
        return app.export_screenshot()


def png(page: Path, out: Path, w: int, h: int) -> None:
    """`page` (HTML or SVG) as a PNG of w x h pixels."""
    subprocess.run(["sh", str(SHOT), str(page), str(out), str(w), str(h)], check=True)


def main() -> None:
    doc = load_report(sys.argv[1])
    dest = Path(sys.argv[2])
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        svg = Path(tmp) / "tui.svg"
        svg.write_text(asyncio.run(tui_svg(doc, (100, 30))))
        png(svg, dest / "tui.png", 1000, 640)
        html = Path(tmp) / "report.html"
        html.write_text(render_html(doc))
        png(html, dest / "html.png", 1000, 900)


if __name__ == "__main__":
    main()
