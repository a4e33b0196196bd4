"""COMP001's modelled speed-up spans the step (issue 55): a cause shown at several places
(a checkpoint on every block) is modelled at every one of them, whatever its share, and a
place with twins doing the same work without the reason (a float64 block among float32 ones)
gives back its time over theirs, the casts it forces inside it counted."""

from __future__ import annotations

from dataclasses import replace

from gpudiag.analyzers.findings.compute import find, reasons, spread
from gpudiag.analyzers.measures.compute import Attainable, ComputeTable, Row
from gpudiag.analyzers.model.thresholds import Thresholds


def unit(name: str, t: float, fwd: float, bwd: float, dtype: str = "float32") -> Row:
    """A unit of `t` seconds of a 1 s step with `fwd` and `bwd` FLOPs (bytes 0)."""
    return Row(name, "unit", t / 3, 2 * t / 3, t, fwd, bwd, 0.0, 8, 100, dtype, 1, t / 2)


def table(*rows: Row) -> ComputeTable:
    att = Attainable(1e9, 1e9, "float32", "calibration")
    return ComputeTable(tuple(rows), 1.0, 5, 2, "Net", "float32", att, "cpu")


class Ctx:
    """What the finder reads: the table, the thresholds and the loop's loading share."""

    class profile:  # noqa: N801 (the context's field)
        @staticmethod
        def share(category: str) -> float:
            return 0.0

    def __init__(self, t: ComputeTable) -> None:
        self.compute, self.th = t, Thresholds()


def test_a_checkpoint_on_every_block_is_modelled_at_every_block():
    # four checkpointed blocks (backward 3x the forward's FLOPs), one under comp_share_warn
    rows = [unit(f"blocks.{i}", s, 1e6, 3e6) for i, s in enumerate((0.25, 0.2, 0.2, 0.1))]
    t = table(*rows, unit("head", 0.05, 1e5, 2e5))
    action = reasons(rows[0], t, Thresholds())[0][1]
    assert abs(spread(action, t, Thresholds()) - 0.75 * 0.25) < 1e-9
    (f,) = find(Ctx(t))  # type: ignore[arg-type]
    assert abs(f.impact - 0.75 * 0.25) < 1e-9  # not the blocks above 15% alone (0.65 x 0.25)


def test_a_float64_block_gives_back_its_time_over_its_float32_twins():
    twins = [unit(f"blocks.{i}", 0.1, 1e6, 2e6) for i in (0, 2, 3)]
    slow = unit("blocks.1", 0.4, 1e6, 2e6, dtype="float64")  # 4x its twins' time
    (f,) = find(Ctx(table(twins[0], slow, *twins[1:])))  # type: ignore[arg-type]
    assert "blocks.1" in f.title and "float64" in f.message
    assert abs(f.impact - 0.4 * 0.75) < 1e-9  # its excess over the twins, above half its time


def test_without_twins_the_reasons_model_stands():
    slow = unit("blocks.1", 0.4, 1e6, 2e6, dtype="float64")
    other = unit("head", 0.1, 5e5, 1e6)
    (f,) = find(Ctx(table(slow, other)))  # type: ignore[arg-type]
    assert abs(f.impact - 0.4 * 0.5) < 1e-9


def group(t: float, elems: float, param_bytes: float, **g: object) -> Row:
    """An optimizer group of `t` seconds of the 1 s step."""
    return Row(
        f"(optimizer) group {g.pop('i', 0)}",
        "optimizer",
        0.0,
        t,
        t,
        0.0,
        0.0,
        None,
        None,
        elems,
        "float32",
        group={"optimizer": "Adam", "tensors": 8, **g},
        param_bytes=param_bytes,
    )


def test_a_float64_block_gives_back_half_the_update_of_its_parameters():
    # blocks.1's 100 float64 elements are 800 of the group's 1,600 bytes (1,000 float32 and
    # it): its update is half the optimizer's 0.2, and float64 halves it
    slow = unit("blocks.1", 0.4, 1e6, 2e6, dtype="float64")
    t = table(slow, unit("head", 0.1, 5e5, 1e6), group(0.2, 1100, 1600))
    (f,) = find(Ctx(t))  # type: ignore[arg-type]
    assert abs(f.impact - (0.4 * 0.5 + 0.2 * 0.5 * 0.5)) < 1e-9


def test_unread_outputs_give_back_the_update_of_their_zero_gradient_parameters():
    wide = Row("inp", "unit", 0.1, 0.3, 0.4, 1e6, 2e6, 0.0, 3, 1000, "float32", 1, 0.2)
    wide = replace(wide, why={"unused": 0.9})
    other = unit("head", 0.1, 5e5, 1e6)
    # 900 of the group's 1,100 elements at zero gradient, most in inp.weight: inp's 1,000
    # elements hold 4,000 of its 4,400 bytes
    zeros = group(0.3, 1100, 4400, zero_grad=900 / 1100, zero_param="inp.weight")
    t = table(wide, other, zeros)
    action = reasons(wide, t, Thresholds())[0][1]
    assert abs(spread(action, t, Thresholds()) - (0.4 * 0.9 + 0.3 * (4000 / 4400) * 0.9)) < 1e-9
    # a head over every position (its outputs unread, its weights' gradients not zero): its
    # update stays
    read = group(0.3, 1100, 4400, zero_grad=0.01, zero_param="head.weight")
    assert abs(spread(action, table(wide, other, read), Thresholds()) - 0.4 * 0.9) < 1e-9


def test_freezing_an_embedding_for_its_zero_gradients_gives_back_its_backward_once():
    # the embedding's backward is its weight gradient (no FLOPs counted: an index, no input
    # gradient); two groups (decay and none) both hold most of their zeros in it
    embed = Row("embed", "unit", 0.01, 0.19, 0.2, 0.0, 0.0, 0.0, 2, 1e6, "float32", 1, 0.01)
    zeros = [
        group(0.5, 1e6, 4e6, zero_grad=0.95, zero_param="embed.weight"),
        group(0.1, 2e5, 8e5, zero_grad=0.9, zero_param="embed.weight", i=1),
    ]
    t = table(embed, unit("mlp", 0.1, 5e5, 1e6), *zeros)
    action = reasons(zeros[0], t, Thresholds())[0][1]
    assert abs(spread(action, t, Thresholds()) - (0.5 * 0.95 + 0.1 * 0.9 + 0.19)) < 1e-9
    # a Linear frozen for its zeros computes its input's gradient still: half its backward
    lin = Row("embed", "unit", 0.01, 0.19, 0.2, 1e6, 2e6, 0.0, 3, 1e6, "float32", 1, 0.01)
    t = table(lin, unit("mlp", 0.1, 5e5, 1e6), zeros[0])
    assert abs(spread(action, t, Thresholds()) - (0.5 * 0.95 + 0.19 * 0.5)) < 1e-9


def test_unread_outputs_upstream_at_the_named_places_span_are_not_given_back_by_its_change():
    """A head over every position with the loss at the last: the norm before it shows the same
    unread share at the same span (its outputs feed only the head's unread positions); the
    selection before the head leaves the norm's work, so the model counts the head alone. An
    unread span of its own (another layer too wide) is a change of its own, counted."""
    last = {"unused": 0.99, "read_dim": 1.0, "read_start": -1.0, "read_len": 1.0}
    head = replace(Row("head", "unit", 0.2, 0.4, 0.6, 1e6, 2e6, 0.0, 3, 1000, "float32", 1, 0.2))
    head = replace(head, why=last)
    norm = replace(unit("norm", 0.2, 1e5, 2e5), why=last)
    wide = replace(unit("wide", 0.1, 1e5, 2e5), why={**last, "read_dim": -1.0, "read_start": 0.0})
    t = table(head, norm, unit("body", 0.05, 5e5, 1e6))
    action = reasons(head, t, Thresholds())[0][1]
    assert abs(spread(action, t, Thresholds(), head) - 0.6 * 0.99) < 1e-9
    assert abs(spread(action, t, Thresholds()) - 0.8 * 0.99) < 1e-9  # no place named: both
    t = table(head, norm, wide)
    assert abs(spread(action, t, Thresholds(), head) - 0.7 * 0.99) < 1e-9


def test_a_selection_after_a_unit_costs_the_zero_gradient_it_writes_over_the_unread_outputs():
    """head(x)[:, -1]: the index's backward writes a gradient of the head's whole output, zeros
    where it is unread; the selection before the head writes none. 100 MB of output (its 4 MB
    of parameters aside) 99% unread, at 1 GB/s: 0.099 s of the 1 s step given back too; none
    where no span was read (an output no loss uses gets no gradient written)."""
    last = {"unused": 0.99, "read_dim": 1.0, "read_start": -1.0, "read_len": 1.0}
    head = Row("head", "unit", 0.2, 0.4, 0.6, 1e6, 2e6, 0.0, 3, 1e6, "float32", 1, 0.2)
    head = replace(head, why=last, io_bytes=104e6)
    t = table(head, unit("body", 0.05, 5e5, 1e6))
    action = reasons(head, t, Thresholds())[0][1]
    assert abs(spread(action, t, Thresholds(), head) - (0.6 * 0.99 + 0.099)) < 1e-9
    t = table(replace(head, why={"unused": 0.99}), unit("body", 0.05, 5e5, 1e6))
    assert abs(spread(action, t, Thresholds()) - 0.6 * 0.99) < 1e-9


def test_a_unit_whose_unread_outputs_hold_a_groups_zero_gradients_is_named_before_the_group():
    # a layer 16x wider than the part read: 94% of its outputs unread, and the optimizer's
    # group (its update the larger share here) zero in 90% of its elements, most in inp.weight
    inp = replace(unit("inp", 0.3, 1e6, 2e6), why={"unused": 0.94}, params=4e6)
    group = Row(
        "(optimizer) group 0", "optimizer", 0.0, 0.5, 0.5, params=4.3e6, param_bytes=1.7e7,
        group={"zero_grad": 0.9, "zero_param": "inp.weight"},
    )  # fmt: skip
    (f,) = find(Ctx(table(inp, unit("head", 0.1, 1e6, 2e6), group)))  # type: ignore[arg-type]
    assert "(inp)" in f.title and "nobody reads" in f.message, f.title
    assert "(optimizer) group 0" in f.message  # the group named beside it
    # a group whose zeros lie in no such unit stays first
    other = replace(group, group={"zero_grad": 0.9, "zero_param": "embed.weight"})
    (g,) = find(Ctx(table(inp, unit("head", 0.1, 1e6, 2e6), other)))  # type: ignore[arg-type]
    assert "(optimizer) group 0" in g.title


def test_a_loop_of_ops_as_large_as_the_units_is_a_bound_not_a_model():
    """A loop in the model's own code of small ops (pos_table's table built position by
    position, 0.9 KiB an op) spends its time on their count: one batched op gives it back, a
    model. One of ops as large as the units' (prefix_mean's running mean, 6 MiB an op) spends it
    on their bytes, and the batched form's own ops over the same data (a cumulative sum) cost
    what nothing here reads: modelled x8-x9, its fix timed bare x3.4-x4.8. Its figure is a
    bound."""
    units = [replace(unit(n, 0.05, 1e6, 2e6), bytes=4e6, ops=4) for n in ("inp", "mlp")]

    def own(nbytes: float) -> Row:
        return Row("(model's own code)", "own", 0.3, 0.6, 0.9, 0.0, 0.0, nbytes, 600)

    (small,) = find(Ctx(table(*units, own(600 * 1024.0))))  # type: ignore[arg-type]
    (large,) = find(Ctx(table(*units, own(600 * 4e6))))  # type: ignore[arg-type]
    assert "a Python loop" in small.message and "a Python loop" in large.message
    assert small.speedup_kind == "model" and large.speedup_kind == "bound"
    assert large.speedup_basis.startswith("a bound: ") and "3,906 KiB an op" in large.speedup_basis
    assert large.impact == small.impact  # the same share: what it bounds, not a new model


def test_a_unit_called_over_and_over_is_a_bound_not_a_model():
    """A unit called once per sample (sample_loop's encoder, 128 calls a step): its calls'
    time given back modelled x6.5-x20 against x6.0 bare for one batched call, which still
    does their FLOPs. Its figure is a bound, and says so; called once a step, the same
    reading of many small ops stays a model."""
    units = [replace(unit(n, 0.05, 1e6, 2e6), bytes=4e6, ops=4) for n in ("inp", "mlp")]

    def encoder(calls: float) -> Row:
        return replace(unit("encoder", 0.85, 3e8, 6e8), bytes=600 * 1024.0, ops=1900, calls=calls)

    (once,) = find(Ctx(table(*units, encoder(1))))  # type: ignore[arg-type]
    (looped,) = find(Ctx(table(*units, encoder(128))))  # type: ignore[arg-type]
    assert "a Python loop" in once.message and "called 128 times" in looped.message
    assert once.speedup_kind == "model" and looped.speedup_kind == "bound"
    assert looped.speedup_basis.startswith("a bound: ") and "128 calls" in looped.speedup_basis
    assert "900 MFLOP a step" in looped.speedup_basis
