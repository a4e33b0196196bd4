"""The wire between the job's hooks and the agent is spelled once (gpudiag_channel): the
environment variables and the step row's width were written three times on two sides."""

from __future__ import annotations

import re
from pathlib import Path

from gpudiag.probes.inject import gpudiag_channel, gpudiag_hooks
from gpudiag.probes.inprocess import channel

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("GPUDIAG_CHANNEL", "GPUDIAG_FIX", "GPUDIAG_TRY_STEPS", "GPUDIAG_CAPTURE_")


def test_the_wire_names_are_spelled_in_one_module():
    spelled = []
    for folder in ("agent", "probes", "analyzers", "tui", "text"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "gpudiag_channel.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if any(re.search(rf"[\"']{name}", code) for name in NAMES):
                    spelled.append(f"{path.relative_to(ROOT)}:{n}")
    # sitecustomize checks the channel before importing anything (every Python start)
    assert spelled == ["probes/inject/sitecustomize.py:14"], spelled
    site = (ROOT / "probes/inject/sitecustomize.py").read_text()
    assert f'"{gpudiag_channel.CHANNEL_ENV}"' in site


def test_both_sides_read_one_step_row_width():
    assert gpudiag_hooks.STEP_WIDTH == gpudiag_channel.STEP_WIDTH == 1 + len(channel.STEP_FIELDS)
