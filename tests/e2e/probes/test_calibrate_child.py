"""The CPU calibration runs in a child process that exits: importing torch in the agent held
about 200 MB for the rest of the run (46 -> 242 MB at the first calibration)."""

from __future__ import annotations

import os
import stat

import pytest

from gpudiag.probes.base import Sample
from gpudiag.probes.inprocess import calibrate as cal


def _gemm(t: int = 7) -> Sample:
    values = {"gemm_m": 64, "gemm_k": 32, "gemm_n": 48}
    return Sample("hooks", t, {"kind": "gemm", "device": "cpu", "dtype": "float32"}, values)


def test_a_shape_is_calibrated_in_a_child_that_reports_its_cost():
    pytest.importorskip("torch")
    c = cal.Calibrator()
    assert c.on_samples([_gemm()]) == []  # started; the child's samples come later
    c.join(120)
    got = c.take()
    assert {s.labels["op"] for s in got} == {"gemm", "copy"}
    assert all(s.t_ns == 7 and s.values["calib_rate"] > 0 for s in got)
    assert c.runs == 1 and c.cpu_s() > 0.0  # the child's CPU (its torch import) is counted
    assert c.take_peak_rss() > 0 and c.take_peak_rss() == 0  # its memory, once a period
    assert c.on_samples([_gemm(8)]) == []  # not again before CALIB_AGAIN_S
    c.join(120)
    assert c.take() == []


def _ran(c: cal.Calibrator, got: list[Sample]) -> list[Sample]:
    """What one call's child gives, waited for."""
    c.on_samples(got)
    c.join(60)
    return c.take()


def test_runs_per_shape_are_bounded_and_a_bad_child_gives_nothing(tmp_path, monkeypatch):
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\ncat >/dev/null\n"
        'echo \'{"samples": [["float32", 5e9, 2e9, 9], ["x"]], "cpu_s": 0.5, "peak_rss": 1}\'\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(cal, "CALIB_AGAIN_S", 0.0)
    c = cal.Calibrator(python=str(fake))
    runs = [_ran(c, [_gemm()]) for _ in range(cal.MAX_RUNS + 2)]
    assert [len(r) for r in runs] == [2] * cal.MAX_RUNS + [0, 0]
    assert c.cpu_s() == pytest.approx(0.5 * cal.MAX_RUNS)
    fake.write_text("#!/bin/sh\necho not json\n")
    assert _ran(cal.Calibrator(python=str(fake)), [_gemm()]) == []
    assert _ran(cal.Calibrator(python=os.devnull), [_gemm()]) == []


def test_the_probe_is_not_held_while_a_child_runs(tmp_path, monkeypatch):
    """The hooks probe calls on_samples inside its drain: a child that takes seconds (torch's
    import at load 5) must not hold it, or the job's queue fills and its rows are lost."""
    flag = tmp_path / "go"
    fake = tmp_path / "python"
    fake.write_text(
        f"#!/bin/sh\ncat >/dev/null\nwhile [ ! -e {flag} ]; do sleep 0.01; done\n"
        'echo \'{"samples": [["float32", 5e9, 2e9, 9]], "cpu_s": 0.5, "peak_rss": 1}\'\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(cal, "CHILD_TIMEOUT_S", 3.0)
    c = cal.Calibrator(python=str(fake))
    assert c.on_samples([_gemm()]) == []  # returned while the child still waits
    flag.touch()
    c.join(30)
    assert len(c.take()) == 2 and c.runs == 1
