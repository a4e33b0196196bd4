"""torch's global settings as one table the hooks read (issue 55): DEBUG001 names every
debugging switch left on with what it costs and how to change it (one cause, one id), and a
look that saw only start-up (a torch.compile before the first step) is never read as the loop."""

from __future__ import annotations

from gpudiag.analyzers import analyze
from gpudiag.analyzers.measures.rules import Classifier
from gpudiag.analyzers.measures.switches import SETTINGS
from gpudiag.probes.inject.gpudiag_hooks import SETTINGS as READS
from gpudiag.probes.inprocess.channel import SWITCHES
from tests.analyzers.scenario import SITE, Scenario
from tests.analyzers.test_debug_switches import scenario
from tests.analyzers.test_findings import ids


def with_settings(sc: Scenario, **values: float) -> Scenario:
    for i in range(5):
        sc._add_at(sc.t0 + (i + 1) * 3_000_000_000, "hooks", {"kind": "switches"}, values)
    return sc


def test_the_table_is_one_mechanism_the_hooks_and_the_analyzers_share():
    """Every setting the hooks read has a field the channel maps and a row of the table."""
    assert [name for name, _ in READS] == list(SWITCHES)
    assert {s.field for s in SETTINGS} <= set(SWITCHES.values())
    for s in SETTINGS:
        assert s.reads and s.costs and s.change and s.slow


def test_deterministic_algorithms_left_on_is_debug001_a_note_with_its_trial():
    a = analyze(with_settings(scenario({}), deterministic_algorithms=1.0).tl)
    assert ids(a) == ["DEBUG001"]
    f = a.findings[0]
    assert f.severity == "note" and f.impact == 0.0  # its cost is in kernels: not guessed
    assert "torch.are_deterministic_algorithms_enabled()" in f.message
    assert f.fix == {"kind": "settings", "values": {"deterministic": False}}
    assert "gpudiag try --fix settings:deterministic=false" in f.recommendation.actions[-1]
    assert "use_deterministic_algorithms(False)" in f.recommendation.actions[0]


def test_anomaly_and_deterministic_on_are_one_debug001_turning_both_off():
    sc = with_settings(
        scenario({"anomaly": 0.12}),
        anomaly_mode=1.0,
        anomaly_check_nan=1.0,
        deterministic_algorithms=1.0,
    )
    a = analyze(sc.tl)
    assert [f.id for f in a.findings].count("DEBUG001") == 1
    f = next(f for f in a.findings if f.id == "DEBUG001")
    assert "anomaly detection" in f.title and "Also on:" in f.message
    assert f.fix == {"kind": "settings", "values": {"anomaly": False, "deterministic": False}}


def test_settings_that_cost_only_on_a_gpu_or_are_defaults_say_nothing_on_a_cpu_job():
    sc = with_settings(
        scenario({}), cudnn_deterministic=1.0, matmul_precision_highest=1.0, cudnn_benchmark=0.0
    )
    a = analyze(sc.tl)
    assert "DEBUG001" not in ids(a)
    assert not [f for f in a.findings if f.severity != "note"]


COMPILE = (
    "<module> (/work/train.py:80);train (/work/train.py:40)"
    f";OptimizedModule._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
    f";_TorchDynamoContext.__call__ ({SITE}/torch/_dynamo/eval_frame.py:600)"
    f";ConvertFrame.__call__ ({SITE}/torch/_dynamo/convert_frame.py:1100)"
    f";compile_fx ({SITE}/torch/_inductor/compile_fx.py:1500)"
    f";Kernel.codegen ({SITE}/torch/_inductor/codegen/simd.py:300)"
)


def test_torch_compile_compiling_under_the_models_call_is_start_up_not_a_forward():
    assert Classifier().category(COMPILE) == "startup"
    runtime = (
        "<module> (/work/train.py:80);train (/work/train.py:40)"
        f";OptimizedModule._wrapped_call_impl ({SITE}/torch/nn/modules/module.py:1511)"
        f";_TorchDynamoContext.__call__ ({SITE}/torch/_dynamo/eval_frame.py:600)"
    )
    assert Classifier().category(runtime) == "forward"  # the compiled model running
