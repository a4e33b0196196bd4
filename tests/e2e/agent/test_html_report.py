"""End to end: `--format html`: one self-contained page with the timeline, findings, GPU panels,
money and flame graph, that fetches nothing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpudiag.agent.output.render.html import render_html
from tests.agent import test_html_report as unit
from tests.conftest import gpudiag

REMOTE = unit.REMOTE
starved = unit.starved  # its fixture: the report of a real H100 run starved by its input pipeline

SCRIPT = Path(__file__).parents[3] / "scripts" / "html_screenshot.sh"


@pytest.mark.skipif(not shutil.which("chromium"), reason="chromium is not installed")
def test_headless_chromium_shows_the_chart_and_findings(tmp_path, starved):
    Image = pytest.importorskip("PIL.Image")
    html, png = tmp_path / "r.html", tmp_path / "r.png"
    html.write_text(render_html(starved))
    res = subprocess.run(
        ["sh", str(SCRIPT), str(html), str(png), "1100", "2400"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    img = Image.open(png).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # not blank
    # the timeline, breakdown and flame graph are drawn: many pixels in data_wait's red,
    # and the error finding's red border
    red = sum(n for n, c in colours if c == (0xE4, 0x57, 0x56))
    assert red > 20_000
    dom = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", html.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "DATA001" in dom and "<svg" in dom


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("chromium"), reason="chromium is not installed")
def test_the_demo_as_a_page_in_headless_chromium(tmp_path):
    """The README's recipe: gpudiag demo, then --format html, then the screenshot script."""
    pytest.importorskip("torch")
    Image = pytest.importorskip("PIL.Image")
    rep, html, png = tmp_path / "demo.json", tmp_path / "demo.html", tmp_path / "demo.png"
    res = gpudiag("demo", "--duration", "25", "--out", str(rep), timeout=300)
    assert res.returncode == 0, res.stderr
    res = gpudiag("report", str(rep), "--format", "html", "--out", str(html))
    assert res.returncode == 0, res.stderr
    page = html.read_text()
    assert not REMOTE.search(page) and "Flame graph of the loop thread" in page
    res = subprocess.run(["sh", str(SCRIPT), str(html), str(png)], capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr
    colours = Image.open(png).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50
