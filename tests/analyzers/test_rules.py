"""Frame rules: what category real py-spy stacks fall in, and user rules."""

from __future__ import annotations

import pytest

from gpudiag.analyzers.measures.rules import (
    Classifier,
    parse_frame,
    rules_from_config,
    user_location,
)
from tests.analyzers.scenario import LOOP, SITE, STACKS

clf = Classifier()


@pytest.mark.parametrize("cat", ["data_wait", "forward", "backward", "optimizer", "checkpoint"])
def test_default_rules_classify_loop_stacks(cat):
    assert clf.category(STACKS[cat]) == cat


def test_sync_is_read_from_the_executing_line():
    assert clf.category(LOOP, "total += loss.item()") == "sync"
    assert clf.category(LOOP, "preds = logits.argmax(1).cpu()") == "sync"
    assert clf.category(LOOP, "total += loss") == "other"


def test_sync_inside_forward_counts_as_sync():
    stack = STACKS["forward"]
    assert clf.category(stack, "if mask.sum().item() > 0:") == "sync"


def test_imports_are_startup_not_collectives():
    stack = (
        f"<module> (/work/train.py:1);_find_and_load (<frozen importlib._bootstrap>:1176);"
        f"<module> ({SITE}/torch/distributed/rpc/__init__.py:81)"
    )
    assert clf.category(stack) == "startup"


def test_collectives():
    stack = f"{LOOP};all_reduce ({SITE}/torch/distributed/distributed_c10d.py:2050)"
    assert clf.category(stack) == "collective"


def test_ddp_forward_is_forward_and_its_broadcasts_are_collectives():
    ddp = f"{SITE}/torch/nn/parallel/distributed.py"
    fwd = f"{LOOP};forward ({ddp}:1600);_run_ddp_forward ({ddp}:1500)"
    fwd += f";_call_impl ({SITE}/torch/nn/modules/module.py:1750);forward (/work/model.py:9)"
    assert clf.category(fwd) != "collective"
    sync = f"{LOOP};forward ({ddp}:1600);_sync_buffers ({ddp}:1900)"
    assert clf.category(sync) == "collective"


def test_user_rule_comes_first():
    rules = rules_from_config([{"category": "data_wait", "function": r"my_pkg\.loader\.fetch$"}])
    stack = f"{LOOP};fetch (/work/my_pkg/loader.py:12)"
    assert Classifier().category(stack) == "other"
    assert Classifier(rules).category(stack) == "data_wait"


@pytest.mark.parametrize(
    "entry,msg",
    [
        ({"category": "nonsense", "file": "x"}, "category must be one of"),
        ({"category": "data_wait"}, "needs function, file or code"),
        ({"category": "data_wait", "file": "("}, "bad regular expression"),
        ({"category": "data_wait", "file": "x", "colour": "red"}, "unknown keys"),
    ],
)
def test_bad_user_rules_are_explained(entry, msg):
    with pytest.raises(ValueError, match=msg):
        rules_from_config([entry])


def test_parse_frame_and_user_location():
    fr = parse_frame(f"Tensor.backward ({SITE}/torch/_tensor.py:522)")
    assert (fr.function, fr.line, fr.is_user) == ("Tensor.backward", 522, False)
    assert fr.dotted == "torch._tensor.Tensor.backward"
    loc = user_location(STACKS["forward"])
    assert (loc.file, loc.line, loc.function) == ("/work/model.py", 20, "Net.forward")


def test_an_optimizer_closure_counts_as_the_model_s_forward_and_backward():
    """LBFGS calls the model from inside optimizer.step(closure): that time is the model's."""
    site = "/v/lib/python3.11/site-packages"
    step = f"<module> (/w/t.py:1);LBFGS.step ({site}/torch/optim/lbfgs.py:300);closure (/w/t.py:50)"
    clf = Classifier()
    assert (
        clf.category(
            f"{step};Module._wrapped_call_impl ({site}/torch/nn/modules/module.py:1"
            f");Seq.forward (/w/t.py:20)"
        )
        == "forward"
    )
    assert clf.category(f"{step};Tensor.backward ({site}/torch/_tensor.py:522)") == "backward"
    assert (
        clf.category(
            f"<module> (/w/t.py:1);Adam.step ({site}/torch/optim/adam.py:9);"
            f"_single_tensor_adam ({site}/torch/optim/adam.py:40)"
        )
        == "optimizer"
    )
