"""`gpudiag run` loads its hooks through a sitecustomize on PYTHONPATH; a Python run with
-I, -E or -S (or a Triton Python backend's stub, embedded and isolated) never imports it.
The hooks' status then says why and what loads them instead, not "the job did not import
torch"."""

from __future__ import annotations

import pytest

from gpudiag.probes.inprocess.channel import HookProbe
from gpudiag.probes.inprocess.isolation import python_flags


@pytest.mark.parametrize(
    ("cmd", "flags"),
    [
        (["python", "-IB", "job.py"], {"I", "B"}),
        (["python3.12", "-W", "ignore", "-E", "job.py"], {"W", "E"}),
        (["python", "-Wignore", "-S", "job.py"], {"W", "S"}),
        (["python", "-c", "-I"], {"c"}),
        (["python", "job.py", "-I"], set()),
        (["python", "-m", "pkg", "-E"], {"m"}),
    ],
)
def test_the_interpreters_own_options_end_at_its_script(cmd, flags):
    assert python_flags(cmd) == flags


def test_the_hooks_status_names_the_cause_and_the_way_to_load_them():
    probe = HookProbe()
    probe.path = "/nonexistent/sock"
    plain = probe.final_status()
    assert "did not import torch" in (plain.reason or "")
    probe.blocked = "the job's Python runs with -I, which skips PYTHONPATH or site"
    told = probe.final_status()
    assert told.available and "-I" in (told.reason or "") and "sitecustomize" in told.reason
    assert "--hooks" in (told.hint or "") and "instrument()" in (told.hint or "")
