"""Plain attach's estimate of where a training step's compute goes (issue 55): the loop
thread's stack samples in the model, by module call site from torch's module-call frames,
with the backward and the optimizer step as rows of their own; the verdict names the top."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import analyze
from gpudiag.analyzers.measures.module_split import class_of, module_calls
from gpudiag.analyzers.measures.rules import parse_stack
from gpudiag.probes.stacks.samples import module_call_sites, source_sample
from tests.analyzers.scenario import STACKS, Scenario
from tests.analyzers.test_findings import windows
from tests.analyzers.test_gpu_findings import ME, timeline
from tests.probes.fake_nvml import FakeGpu

GPT = {
    "lm_head": 0.40,
    "c_attn": 0.10,
    "gpt_own": 0.05,
    "backward": 0.30,
    "adam_step": 0.10,
    "data_wait": 0.03,
    "other": 0.02,
}


def split_of(shares: dict[str, float]):
    sc = windows(Scenario(cpu_count=8), n=5, shares=shares).host(0.3).process(0.9)
    return analyze(sc.tl)


def test_the_leaf_module_is_named_at_the_parents_line_that_called_it():
    a = split_of(GPT)
    rows = a.compute_stacks["rows"]
    top = rows[0]
    assert (top["kind"], top["module"]) == ("call", "Linear")
    assert (top["site"]["file"], top["site"]["line"]) == ("/work/model.py", 88)
    assert top["site"]["function"] == "GPT.forward"
    assert top["share"] == pytest.approx(0.40, abs=0.01)
    assert top["label"] == "Linear called at model.py:88 (GPT.forward)"
    by = {(r["kind"], (r["site"] or {}).get("line")): r for r in rows}
    # a projection inside every block is named at its attention's line, not the block's
    assert by[("call", 30)]["module"] == "Linear"
    assert by[("call", 30)]["share"] == pytest.approx(0.10, abs=0.01)
    # the model's own code at its line, with the line's text
    own = by[("own", 85)]
    assert own["module"] == "GPT" and own["code"] == "x = tok + pos"
    # the backward and the optimizer at the loop's line that ran them
    assert by[("backward", 40)]["share"] == pytest.approx(0.30, abs=0.01)
    opt = by[("optimizer", 40)]
    assert opt["module"] == "Adam.step" and opt["share"] == pytest.approx(0.10, abs=0.01)
    assert a.compute_stacks["model_share"] == pytest.approx(0.95, abs=0.01)
    assert a.compute_stacks["time"] == "cpu" and "CPU time" in a.compute_stacks["note"]


def test_the_verdict_names_the_top_call_site_and_how_to_measure_it():
    a = split_of(GPT)
    v = a.verdict
    assert v["finding"] is None and not v["sure"]
    s = v["statement"]
    assert "not judged: the model's compute" in s  # never a sure "no bottleneck"
    assert "the forward 55% (top: 40% in Linear called at model.py:88 (GPT.forward)" in s
    assert "the backward 30%" in s and "the optimizer 10%" in s
    assert "gpudiag attach --hooks PID" in s
    # a big share is not a cause by itself: no warning on it
    assert not [f for f in a.findings if f.severity in ("warning", "error")]


def test_a_layer_of_a_sequential_is_named_at_the_line_that_called_the_container():
    a = split_of({"seq_linear": 0.5, "backward": 0.4, "optimizer": 0.1})
    top = a.compute_stacks["rows"][0]
    assert top["module"] == "Linear in Sequential"
    assert (top["site"]["file"], top["site"]["line"]) == ("/work/train.py", 40)


def test_a_wrapper_hands_the_call_on():
    """Under DistributedDataParallel the model's head is still the head, not the model's own
    code at DDP's line."""
    a = split_of({"ddp_head": 0.5, "backward": 0.4, "optimizer": 0.1})
    top = a.compute_stacks["rows"][0]
    assert top["label"] == "Linear called at model.py:88 (GPT.forward)"


def test_on_a_gpu_the_shares_are_launch_time():
    a = analyze(timeline(FakeGpu(job_pids=[ME]), shares=GPT).tl)
    cs = a.compute_stacks
    assert cs["time"] == "launch" and "not the GPU's time" in cs["note"]


def test_module_calls_and_classes_from_py_spy_frames():
    frames = parse_stack(STACKS["c_attn"])
    calls = module_calls(frames)
    assert [frames[c].function for _, c in calls] == [
        "GPT.forward",
        "Block.forward",
        "CausalSelfAttention.forward",
        "Linear.forward",
    ]
    assert [frames[p].function for p, _ in calls][-1] == "CausalSelfAttention.forward"
    assert class_of(frames[calls[-1][1]]) == "Linear"
    assert class_of(parse_stack("make.<locals>.Net.forward (/w/m.py:3)")[0]) == "Net"
    assert class_of(parse_stack("forward (/w/m.py:3)")[0]) == ""


def test_the_calling_lines_text_names_the_call_when_the_probe_read_it():
    """The stack probe sends the text of each line it saw calling a module once (kind=source);
    the row names the call by it, and the line's text is no stack of the loop."""
    sc = Scenario(cpu_count=8)
    sc._add(
        "stacks",
        {
            "kind": "source",
            "file": "/work/model.py",
            "line": "88",
            "code": "return self.head(x)  # logits",
        },
        {"seen": 1.0},
    )
    a = analyze(windows(sc, n=5, shares=GPT).host(0.3).process(0.9).tl)
    top = a.compute_stacks["rows"][0]
    assert top["call"] == "return self.head(x)  # logits"
    assert top["label"] == "`return self.head(x)` (Linear) at model.py:88 (GPT.forward)"
    assert "40% in `return self.head(x)` (Linear) at model.py:88" in a.verdict["statement"]
    assert a.profile.samples == pytest.approx(split_of(GPT).profile.samples)


def test_the_probe_sends_the_lines_that_call_a_module():
    frames = tuple(STACKS["c_attn"].split(";"))
    sites = module_call_sites(frames)
    assert [s.split(" (")[0] for s in sites] == [
        "train",
        "GPT.forward",
        "Block.forward",
        "CausalSelfAttention.forward",
    ]
    s = source_sample("stacks", 1, sites[-1], "qkv = self.c_attn(x)")
    assert s.labels == {
        "kind": "source",
        "file": "/work/model.py",
        "line": "30",
        "code": "qkv = self.c_attn(x)",
    }


def _own_call(shares: dict[str, float]):
    from gpudiag.analyzers.measures.module_split import own_call
    from gpudiag.analyzers.model.thresholds import Thresholds
    from tests.analyzers.test_loader_verdicts import loop_context

    sc = windows(Scenario(cpu_count=8), n=5, shares=shares).host(0.3).process(0.9)
    c = loop_context(sc.tl, Thresholds())
    return own_call(c.view, c.profile, c.clf)


def test_the_helper_the_models_own_code_runs_in_is_named_for_its_cache_trial():
    got = _own_call({"gpt_helper": 0.3, "gpt_own": 0.05, "lm_head": 0.2, "backward": 0.45})
    assert got is not None and got.function == "positional_table"
    assert got.target == "model.positional_table"  # as `try --fix cache:` takes it
    assert got.share == pytest.approx(0.3 / 0.35, abs=0.02)  # of the own code's samples


def test_a_comprehension_inline_in_the_forward_names_no_helper():
    """A loop written in the forward itself has no function of its own to cache."""
    assert _own_call({"gpt_listcomp": 0.4, "lm_head": 0.2, "backward": 0.4}) is None
    # under the hooks torch calls the forward through `_call_impl.<locals>.inner`: the forward
    # is still the model's, not a helper below it
    assert _own_call({"gpt_listcomp_hooked": 0.4, "lm_head": 0.2, "backward": 0.4}) is None
