"""The in-job compute sampler (gpudiag_compute): the units it finds, the FLOPs it counts (as
torch.utils.flop_counter's FlopCounterMode counts them), and what the agent reads back."""

from __future__ import annotations

import copy
import time

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from gpudiag.analyzers.findings.compute import find  # noqa: E402
from gpudiag.analyzers.measures.compute import compute_table  # noqa: E402
from gpudiag.analyzers.timeline.timeline import Timeline  # noqa: E402
from gpudiag.probes.inject import gpudiag_compute as gc  # noqa: E402
from gpudiag.probes.inprocess.compute_rows import compute_samples  # noqa: E402


class Net(nn.Module):
    def __init__(self, double_block: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(32, 4)
        if double_block:
            self.blocks[1].double()
        self.double_block = double_block

    def forward(self, x):
        x = self.inp(x)
        for i, b in enumerate(self.blocks):
            x = b(x.double()).float() if self.double_block and i == 1 else b(x)
        return self.head(x)


def _train(model, steps: int, counting: bool) -> list[dict]:
    """Steps of `model` with a sampler arming every step (counting or timing)."""
    sampler = gc.Sampler(torch, [model])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    records = []
    for i in range(steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sampler.note_optimizer(opt)
        if sampler.armed is not None:
            sampler._finish()
            records += sampler.take()
        if i + 1 < steps:
            sampler._arm(counting)
    return records


def test_units_are_the_models_children_with_containers_opened():
    names = [n for n, _ in gc.find_units(Net())]
    assert names == ["inp", "blocks.0", "blocks.1", "blocks.2", "head"]


def test_a_wrapper_of_one_child_is_looked_through():
    wrapped = nn.Sequential()
    wrapped.add_module("module", Net())
    assert [n for n, _ in gc.find_units(wrapped)][0] == "module.inp"


def test_counted_flops_match_flop_counter_mode():
    model = Net()
    recs = [r for r in _train(model, 3, counting=True) if r["count"]]
    assert recs
    work = {row[0]: row for row in recs[-1]["work"]}
    ours = sum(row[1] + row[2] for row in work.values())
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    ref = copy.deepcopy(model)
    with FlopCounterMode(display=False) as fc:
        nn.functional.cross_entropy(ref(x), y).backward()
    assert ours == fc.get_total_flops()
    assert work["blocks.0"][2] == 2 * work["blocks.0"][1]  # a backward: 2x its forward
    assert work["blocks.0"][8] == "float32"


def test_hooks_are_taken_out_after_the_armed_step_and_never_on_the_model():
    from torch.nn.modules import module as nn_module

    model = Net()
    sampler = gc.Sampler(torch, [model])
    sampler._arm(True)
    assert not model._forward_hooks and not model.blocks[0]._forward_pre_hooks
    copy.deepcopy(model)  # an EMA's deepcopy while armed: nothing of ours on the model
    nn.functional.cross_entropy(model(torch.randn(2, 16)), torch.tensor([0, 1])).backward()
    sampler._finish()
    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks
    assert not getattr(torch.autograd.backward, "_gpudiag", 0)


def test_timed_records_cover_every_unit():
    recs = [r for r in _train(Net(), 3, counting=False) if not r["count"]]
    names = {u[0] for u in recs[-1]["units"]}
    assert names == {"inp", "blocks.0", "blocks.1", "blocks.2", "head"}
    assert all(u[1] >= 0 and u[2] >= 0 for u in recs[-1]["units"])


def _table(model, steps: int = 4):
    recs = _train(model, 2, counting=True) + _train(model, steps, counting=False)
    tl = Timeline()
    for i, rec in enumerate(recs):
        rec["t"] = 1.8e9 + i
        tl.extend(compute_samples({"cmp": [rec]}))
    return compute_table(tl.whole())


def test_a_looks_first_sampled_step_is_timed_then_counted_then_spaced(monkeypatch):
    """The first armed step (the one after WARMUP_STEPS) is timed: the table needs a timed
    step, and a look of a few slow steps (TRL's sft.py under `run`: 7 steps at 7 s) ended
    before the timed step that came after two counts. The next COUNT_FIRST armed steps count
    the work; then a count waits COUNT_MIN_S or more; a new look (restart) times its first
    armed step again, then owes counts."""
    monkeypatch.setattr(gc, "SAMPLE_EVERY_S", 0.0)
    model = Net()
    sampler = gc.Sampler(torch, [model])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    kinds, first = [], None
    for i in range(gc.WARMUP_STEPS + gc.COUNT_FIRST + 3):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sampler.note_optimizer(opt)
        sampler.on_step()
        got = [r["count"] for r in sampler.take()]
        if got and first is None:
            first = i + 1  # the step whose end finished the first armed step
        kinds += got
    assert first == gc.WARMUP_STEPS + 1  # armed on the step right after the warm-up
    assert kinds[: 1 + gc.COUNT_FIRST] == [0] + [1] * gc.COUNT_FIRST
    assert set(kinds[1 + gc.COUNT_FIRST :]) == {0}
    assert sampler.count_at - __import__("time").monotonic() >= gc.COUNT_MIN_S - 1
    sampler.restart()
    sampler.on_step()
    assert sampler.armed is not None and not sampler.armed.counting
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    sampler.on_step()
    assert sampler.armed is not None and sampler.armed.counting
    sampler.cancel()


def test_a_timed_steps_places_leave_out_the_hooks_own_time(monkeypatch):
    """On a CPU the hooks' bodies run on the job's thread inside the places they time (the zero
    share of each unit's output gradient, read as its backward begins; a unit's input keyed
    before its forward): they are taken out of those places and of the step, and sent as
    `hooks`. broadcast_matmul's timed step spent 0.6-0.7 ms in them, its fixed step being
    1.3-1.5 ms bare: the places left after a change read twice their time."""
    slow = 0.2  # far above what a busy box's preemption adds to a tiny unit's backward

    def zero_share(grad, stride=1):  # a reading that takes a known time
        time.sleep(slow)
        return 0.0

    monkeypatch.setattr(gc, "zero_share", zero_share)
    recs = [r for r in _train(Net(), 3, counting=False) if not r["count"]]
    assert recs
    for rec in recs:
        assert rec["hooks"] >= 5 * slow  # five units' output gradients read
        # left in, the reads would put 5 x slow in the backward; a busy box's preemption
        # (load 5: up to 0.14 s seen) stays under 2 x slow
        assert all(u[2] < 2 * slow for u in rec["units"]), rec["units"]
        assert rec["bwd"] < 2 * slow and rec["step"] < rec["hooks"]


def test_a_timed_record_carries_the_time_of_the_steps_nothing_timed(monkeypatch):
    """A timed step pays its hooks; the steps between timed ones pay none. Each timed record
    carries the mean wall time of the last bare steps (from one optimizer post-hook to the
    next, as a timed step's is taken), and the table reads it as bare_step_s; a counted step's
    record carries none (its time is not used), nor a timed one before 3 bare steps."""
    monkeypatch.setattr(gc, "SAMPLE_EVERY_S", 0.0)
    model = Net()
    sampler = gc.Sampler(torch, [model])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    recs = []
    for _ in range(gc.WARMUP_STEPS + 2 * (gc.COUNT_FIRST + 8)):
        if sampler.armed is None:
            time.sleep(0.01)  # a bare step's own work: at least 10 ms
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sampler.note_optimizer(opt)
        sampler.next_at = 0.0 if sampler.armed is None else float("inf")  # bare, armed, ...
        sampler.on_step()
        recs += sampler.take()
    sampler.cancel()
    timed = [r for r in recs if not r["count"]]
    assert [r for r in recs if r["count"]] and all("bare" not in r for r in recs if r["count"])
    assert "bare" not in timed[0]  # the look's first timed step: no bare steps before it
    with_bare = [r for r in timed if "bare" in r]
    assert len(with_bare) >= 3 and all(r["bare"] >= 0.01 for r in with_bare)
    tl = Timeline()
    for i, rec in enumerate(recs):
        rec["t"] = 1.8e9 + i
        tl.extend(compute_samples({"cmp": [rec]}))
    t = compute_table(tl.whole())
    assert t is not None and t.bare_s is not None
    assert abs(t.bare_s - sum(r["bare"] for r in with_bare) / len(with_bare)) < 1e-9
    assert t.to_dict()["bare_step_s"] == round(t.bare_s, 6)


def test_records_a_full_queue_refused_are_put_back_first():
    sampler = gc.Sampler(torch, [Net()])
    sampler.records = [{"t": 2.0}]
    sampler.put_back([{"t": 1.0, "count": 1}])
    assert [r["t"] for r in sampler.take()] == [1.0, 2.0]
    sampler.put_back([{"t": float(i)} for i in range(gc.MAX_RECORDS + 5)])
    assert len(sampler.take()) == gc.MAX_RECORDS


def test_a_window_without_counts_reads_the_runs_counted_work():
    """The look's counted steps before its window (start-up): the work is the run's."""
    model = Net()
    recs = _train(model, 2, counting=True) + _train(model, 4, counting=False)
    tl, late = Timeline(), Timeline()
    for i, rec in enumerate(recs):
        rec["t"] = 1.8e9 + i
        tl.extend(compute_samples({"cmp": [rec]}))
        if not rec["count"]:
            late.extend(compute_samples({"cmp": [rec]}))
    t = compute_table(late.whole(), whole=tl.whole())
    assert t is not None and t.counted_steps == 1
    assert {r.name: r for r in t.rows}["blocks.0"].flops == 3 * 2 * 8 * 32 * 32
    alone = compute_table(late.whole())
    assert alone is not None and alone.counted_steps == 0 and alone.flops == 0


def test_the_table_reads_each_units_work_and_dtype():
    t = _table(Net(double_block=True))
    assert t is not None and t.counted_steps == 1
    rows = {r.name: r for r in t.rows}
    assert rows["blocks.1"].dtype == "float64" and rows["blocks.0"].dtype == "float32"
    assert rows["blocks.0"].flops == 3 * 2 * 8 * 32 * 32
    assert 0.5 <= sum(r.share for r in t.rows) <= 1.05  # the outside row is clamped at 0


def test_malformed_records_are_dropped():
    assert compute_samples({"cmp": [{"t": "x"}, 5, {"t": 1e9, "step": float("nan")}]}) == []
    got = compute_samples({"cmp": [{"t": 1e9, "step": 0.1, "units": [["a", -1, 0, 1]]}]})
    assert [s.labels["kind"] for s in got] == ["compute_step"]


def test_comp001_names_the_float64_block_and_not_a_healthy_model(monkeypatch):
    from dataclasses import replace

    from gpudiag.analyzers.model.thresholds import Thresholds

    class C:  # the finder reads the table, the thresholds and the loop's loading share
        class profile:  # noqa: N801 (the context's field)
            @staticmethod
            def share(category: str) -> float:
                return 0.0

    th = replace(Thresholds(), comp_share_warn=0.0)
    for model, named in ((Net(double_block=True), "blocks.1"), (Net(), None)):
        c = C()
        c.compute, c.th = _table(model), th
        found = find(c)  # type: ignore[arg-type]
        if named is None:
            assert found == [] or "float64" not in found[0].message
        else:
            assert found and found[0].id == "COMP001" and named in found[0].title
            assert "float64" in found[0].message


def test_comp001_with_no_reason_read_is_a_note_and_a_reason_ranks_first():
    """A place far below the rest of the model with nothing read to say why is a note (its
    cost is a bound, no change named); one whose work shows why leads."""
    from dataclasses import replace

    from gpudiag.analyzers.measures.compute import Attainable, ComputeTable, Row
    from gpudiag.analyzers.model.thresholds import Thresholds

    def row(name, share, t, flops, dtype="float32"):
        return Row(
            name,
            "unit",
            t / 2,
            t / 2,
            share,
            flops / 3,
            2 * flops / 3,
            0.0,
            8,
            0,
            dtype,
            roofline_s=flops / 1e9,
        )

    def table(*rows):
        att = Attainable(1e9, 1e9, "float32", "calibration")
        return ComputeTable(tuple(rows), 1.0, 5, 1, "Net", "float32", att, "cpu")

    class C:  # the finder reads the table, the thresholds and the loop's loading share
        class profile:  # noqa: N801 (the context's field)
            @staticmethod
            def share(category: str) -> float:
                return 0.0

    c = C()
    c.th = Thresholds()
    slow = row("slow", 0.3, 0.3, 0.003e9)  # 1% efficient, nothing read
    fine = [row(f"b{i}", 0.2, 0.2, 0.1e9) for i in range(3)]  # 50% efficient
    c.compute = table(slow, *fine)
    (f,) = find(c)  # type: ignore[arg-type]
    assert f.severity == "note" and "(slow)" in f.title
    double = replace(fine[0], name="dbl", dtype="float64", share=0.25)
    c.compute = table(slow, double, *fine[1:])
    (f,) = find(c)  # type: ignore[arg-type]
    assert "(dbl)" in f.title and f.severity != "note" and "float64" in f.message
