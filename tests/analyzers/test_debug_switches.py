"""DEBUG001: autograd's anomaly detection left on, from the stacks' records and the hooks'
switch; the same frames from fx's tracer or the job's own code are no record."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.findings.debug_switches import RECORD_TO_WHOLE
from gpudiag.analyzers.measures.rules import parse_stack
from gpudiag.analyzers.measures.switches import is_anomaly_record
from gpudiag.probes.base import Sample
from gpudiag.probes.inprocess.channel import parse_message
from tests.analyzers.scenario import STACKS, Scenario
from tests.analyzers.test_findings import ids, windows

TRAIN = {"forward": 0.3, "backward": 0.35, "optimizer": 0.1}


def scenario(extra: dict[str, float], anomaly_on: bool = False) -> Scenario:
    rest = 1.0 - sum(extra.values())
    shares = {k: v * rest / sum(TRAIN.values()) for k, v in TRAIN.items()} | extra
    sc = windows(Scenario(cpu_count=8), n=5, shares=shares).host(0.3).process(0.9)
    if anomaly_on:
        for i in range(5):
            sc._add_at(
                sc.t0 + (i + 1) * 3_000_000_000,
                "hooks",
                {"kind": "switches"},
                {"anomaly_mode": 1.0, "anomaly_check_nan": 1.0},
            )
    return sc


@pytest.mark.parametrize(
    ("name", "record"), [("anomaly", True), ("fx_trace", False), ("user_traceback", False)]
)
def test_only_a_format_stack_called_by_a_torch_op_is_a_record(name, record):
    assert is_anomaly_record(parse_stack(STACKS[name])) is record


def test_records_in_the_stacks_are_debug001_with_a_range_from_the_records():
    a = analyze(scenario({"anomaly": 0.12}).tl)
    assert ids(a)[0] == "DEBUG001"
    f = a.findings[0]
    assert f.speedup_kind == "hypothesis"
    assert f.speedup_low == pytest.approx(1 / (1 - 0.12), rel=0.02)
    assert f.impact == pytest.approx(min(0.9, 0.12 * RECORD_TO_WHOLE), rel=0.02)
    assert f.fix == {"kind": "anomaly_off", "values": {}}
    assert f.signals == ("stacks",) and "seen in the stacks" in f.message
    ev = {e.metric: e for e in f.evidence}
    assert ev["anomaly_record_share"].setting == "anomaly_record_warn"
    assert not a.verdict["sure"] and "unverified" in a.verdict["statement"]


def test_the_hooks_switch_makes_it_sure_of_the_cause_and_a_few_records_a_note():
    a = analyze(scenario({"anomaly": 0.004}, anomaly_on=True).tl)
    f = next(f for f in a.findings if f.id == "DEBUG001")
    assert f.confidence >= 0.95 and f.signals == ("hooks", "stacks")
    assert f.severity == "note"
    ev = {e.metric: e for e in f.evidence}
    assert ev["anomaly_mode"].value == 1.0 and ev["anomaly_record_share"].threshold is None


def test_no_records_and_no_switch_is_no_finding():
    assert "DEBUG001" not in ids(analyze(scenario({"fx_trace": 0.1}).tl))
    assert "DEBUG001" not in ids(analyze(scenario({"user_traceback": 0.1}).tl))
    assert "DEBUG001" not in ids(analyze(scenario({}).tl))


def test_the_hooks_datagram_carries_the_switch():
    got = parse_message({"v": 2, "width": 9, "switches": {"anomaly": 1, "anomaly_check_nan": 0}})
    assert [(s.labels, s.values) for s in got] == [
        ({"kind": "switches"}, {"anomaly_mode": 1.0, "anomaly_check_nan": 0.0})
    ]
    assert parse_message({"v": 2, "width": 9, "switches": {"anomaly": "x", "rm": 1}}) == []
    assert all(isinstance(s, Sample) for s in got)


def test_the_hooks_read_the_switch_from_torch():
    torch = pytest.importorskip("torch")
    from gpudiag.probes.inject.gpudiag_hooks import _switches

    default = {
        "anomaly": 0,
        "deterministic": 0,
        "matmul_highest": 1,
        "cudnn_benchmark": 0,
        "cudnn_deterministic": 0,
    }
    assert _switches(torch) == default  # every row of the table, read from torch's state
    with torch.autograd.detect_anomaly(check_nan=False):
        assert _switches(torch) == {**default, "anomaly": 1, "anomaly_check_nan": 0}
    torch.use_deterministic_algorithms(True)
    try:
        assert _switches(torch)["deterministic"] == 1
    finally:
        torch.use_deterministic_algorithms(False)
    assert _switches(torch) == default
