"""End to end: public training scripts nobody here wrote: the right, stable top finding in both
modes.

The truth per script is what timing its fix measured (docs/public-scripts.md): a warning only
where a fix moves the job by >= 15%. The benchmark's own logic is tested without jobs below.
"""

from __future__ import annotations

import pytest

from benchmarks.public_scripts import (
    BY_NAME,
    judge,
    look,
    time_fix,
)
from tests.public.test_public_scripts import FINETUNE, TRUTH


def test_a_round_that_times_out_is_lost_not_fatal(monkeypatch):
    import subprocess

    def hang(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(subprocess, "run", hang)
    assert time_fix(BY_NAME["mnist"], 1, 1.0)["error"] == "the job printed no step count"


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in TRUTH if n not in FINETUNE])
@pytest.mark.parametrize("mode,seconds", [("run", 25.0), ("attach", 20.0)])
def test_public_script_verdict(name, mode, seconds, tmp_path):
    looks = [look(BY_NAME[name], mode, tmp_path / f"{mode}-{i}.json", seconds) for i in range(2)]
    j = judge(looks, TRUTH[name])
    assert j["right"] and j["stable"], looks
