"""What the in-job compute sampler reads from a step's tensors (issue 55's open world): outputs
nobody reads, gradients no optimizer takes, a second call on the same input, a constant
recomputed, an optimizer group updating zero gradients; the model found from a whole step; the
model's own code's backward apart from its units'. COMP001 names each at its module or group."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gpudiag.analyzers.findings.compute import find, trial  # noqa: E402
from gpudiag.analyzers.measures.compute import compute_table  # noqa: E402
from gpudiag.analyzers.model.thresholds import Thresholds  # noqa: E402
from gpudiag.analyzers.timeline.timeline import Timeline  # noqa: E402
from gpudiag.probes.inject import gpudiag_compute as gc  # noqa: E402
from gpudiag.probes.inprocess.compute_rows import compute_samples  # noqa: E402


def mlp(w: int = 32) -> nn.Sequential:
    return nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w))


class Frozen(nn.Module):  # a backbone meant frozen, its parameters left requiring grad
    def __init__(self) -> None:
        super().__init__()
        self.backbone, self.head = mlp(), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.backbone(x))


class LastOnly(nn.Module):  # a head over every position; the loss reads the last
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))[:, -1]


class Twice(nn.Module):  # the encoder run again on the same batch
    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.head, self.aux = mlp(), nn.Linear(32, 4), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.encoder(x)) + self.aux(self.encoder(x))


class Constant(nn.Module):  # a frozen encoder of constant prompts, every step
    def __init__(self) -> None:
        super().__init__()
        self.text, self.image = mlp(), nn.Linear(32, 32)
        self.text.requires_grad_(False)
        self.prompts = torch.randn(4, 32)

    def forward(self, x):
        with torch.no_grad():
            t = self.text(self.prompts)
        return self.image(x) @ t.T


class Embed(nn.Module):  # a large table, few rows looked up a step
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(5000, 32), nn.Linear(32, 4)

    def forward(self, tokens):
        return self.head(self.embed(tokens).mean(dim=1))


class OwnLoop(nn.Module):  # a loop over positions in the model's own code between units
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.head = nn.Linear(32, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = self.inp(x)
        pooled = torch.stack([h[:, : i + 1].mean(dim=1) for i in range(h.shape[1])], dim=1)
        return self.head(pooled.mean(dim=1))


def _x(model: nn.Module) -> torch.Tensor:
    if isinstance(model, Embed):
        return torch.randint(0, 5000, (8, 6))
    if isinstance(model, (LastOnly, OwnLoop)):
        return torch.randn(8, 80 if isinstance(model, OwnLoop) else 16, 32)
    return torch.randn(8, 32)


def _table(
    model: nn.Module,
    monkeypatch,
    steps: int = 10,
    x: torch.Tensor | None = None,
    accumulate: int = 1,
):
    """The model trained `steps` steps with the sampler arming a step whenever it may (a step
    to find the model, one counted, then timed ones), its records read back as the table;
    `accumulate` micro-batches a step (gradient accumulation)."""
    monkeypatch.setattr(gc, "SAMPLE_EVERY_S", 0.0)
    params = model.head.parameters() if isinstance(model, Frozen) else model.parameters()
    opt = torch.optim.Adam([p for p in params if p.requires_grad], lr=1e-3)
    sampler = gc.Sampler(torch, [])  # no model seen forwarding: the step shows it
    sampler.note_optimizer(opt)
    hook = opt.register_step_post_hook(lambda o, a, k: sampler.on_step())
    x, y = _x(model) if x is None else x, torch.randint(0, 4, (8,))
    try:
        for _ in range(steps):
            opt.zero_grad()
            for i in range(accumulate):  # each micro-batch a batch of its own
                xb = x if i == 0 else torch.randn_like(x)
                F.cross_entropy(model(xb), y).backward()
            opt.step()
    finally:
        hook.remove()
    recs = sampler.take()
    sampler.cancel()  # the step armed after the last one: its global hooks out
    tl = Timeline()
    for i, rec in enumerate(recs):
        rec["t"] = 1.8e9 + i
        tl.extend(compute_samples({"cmp": [rec]}))
    return compute_table(tl.whole())


def _comp001(t):
    class C:
        class profile:  # noqa: N801 (the context's field)
            @staticmethod
            def share(category: str) -> float:
                return 0.0

    c = C()
    c.compute, c.th = t, replace(Thresholds(), comp_share_warn=0.0)
    return find(c)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "named", "said"),
    [
        (Frozen, "backbone", "no optimizer updates"),
        (LastOnly, "head|body", "zero gradient"),  # both compute unread rows: 0.1 ms each
        (Twice, "encoder", "already had in the same step"),
        (Constant, "text", "same unchanged input"),
        (Embed, "(optimizer) group 0", "embed.weight"),
        (OwnLoop, "(model's own code)", "ops a step"),
    ],
)
def test_the_cause_is_read_from_the_steps_tensors_and_named(model, named, said, monkeypatch):
    t = _table(model(), monkeypatch)
    assert t is not None and t.model == model.__name__  # found from a whole step
    (f,) = _comp001(t)
    assert f.severity == "warning" and any(f"({n})" in f.title for n in named.split("|")), f.title
    assert said in f.message, f.message


def test_a_healthy_model_shows_none_of_it(monkeypatch):
    t = _table(nn.Sequential(mlp(), nn.Linear(32, 4)), monkeypatch)
    for row in t.rows:
        assert not (row.why.get("orphan") or row.why.get("repeat") or row.why.get("constant"))
        assert (row.why.get("unused") or 0.0) < 0.75
        assert (row.group.get("zero_grad") or 0.0) < 0.75
    assert all(f.severity == "note" for f in _comp001(t))


def test_the_own_codes_backward_is_its_own_not_the_last_units(monkeypatch):
    rows = {r.name: r for r in _table(OwnLoop(), monkeypatch).rows}
    assert rows["(model's own code)"].bwd_s > 0  # (no wall-clock comparison: a busy box)
    assert (rows["(model's own code)"].ops or 0) > 10 * (rows["head"].ops or 1)


def test_a_gan_s_two_optimizers_leave_no_gradient_orphaned(monkeypatch):
    model = Frozen()
    other = torch.optim.SGD(model.backbone.parameters(), lr=0.1)  # the backbone's own optimizer
    monkeypatch.setattr(gc, "SAMPLE_EVERY_S", 0.0)
    opt = torch.optim.Adam(model.head.parameters())
    sampler = gc.Sampler(torch, [model])
    for o in (other, opt):
        sampler.note_optimizer(o)
    hook = opt.register_step_post_hook(lambda o, a, k: sampler.on_step())
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    for _ in range(8):
        F.cross_entropy(model(x), y).backward()
        other.step()
        opt.step()
        other.zero_grad()
        opt.zero_grad()
    hook.remove()
    why = [w for rec in sampler.take() for w in rec.get("why", [])]
    sampler.cancel()
    assert why and all(w[2] == 0 for w in why)


class DeepEncoder(
    nn.Module
):  # a deep stack beside a dropout and a head (a *ForSequenceClassification)
    def __init__(self) -> None:
        super().__init__()
        layers = [m for _ in range(40) for m in (nn.Linear(32, 32), nn.ReLU())]
        self.body, self.drop, self.head = nn.Sequential(*layers), nn.Dropout(0.1), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.drop(self.body(x)))


def test_a_deep_encoder_beside_a_small_head_is_no_loop(monkeypatch):
    """Hugging Face's classifiers read COMP001 'a Python loop over items' on their encoder:
    its 200+ full-size ops against a dropout's and a head's one or two. Many ops of a module's
    full size, called once a step, are depth, not a loop."""
    t = _table(DeepEncoder(), monkeypatch)
    body = next(r for r in t.rows if r.name == "body")
    assert body.ops is not None and body.ops >= Thresholds().comp_ops_min  # the count alone fires
    assert not any("loop" in f.message for f in _comp001(t) if f.severity == "warning")


def test_a_deep_encoder_called_once_a_micro_batch_is_no_loop(monkeypatch):
    """Gradient accumulation calls every module once per micro-batch (4 a step here; TRL's
    sft.py README runs 8): the encoder's calls are its peers' calls, not a loop over items."""
    t = _table(DeepEncoder(), monkeypatch, accumulate=4)
    body = next(r for r in t.rows if r.name == "body")
    assert body.calls is not None and body.calls >= 4  # the call count alone fires
    assert not any("loop" in f.message for f in _comp001(t) if f.severity == "warning")
    assert not any(f.fix and f.fix["kind"] == "batched" for f in _comp001(t))  # no batch trial


class Checkpointed(nn.Module):  # a stack of blocks, each checkpointed (gradient_checkpointing)
    def __init__(self) -> None:
        super().__init__()
        # a block's last op saves its output: its recompute runs the whole block
        self.layers = nn.ModuleList(nn.Sequential(mlp(), nn.Tanh()) for _ in range(8))

    def forward(self, x):
        for block in self.layers:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return x


class OneUnit(nn.Module):  # a whole model in one top-level unit (a *ForCausalLM's `model`)
    def __init__(self) -> None:
        super().__init__()
        # a second child its forward does not call: the table holds one unit, as TRL's Qwen2's
        # did (its `model`; no row for lm_head), and a single child would be looked through
        self.model, self.spare = Checkpointed(), nn.Linear(32, 4)
        self.proj = nn.Parameter(torch.randn(32, 4) / 6)  # the head in the model's own code

    def forward(self, x):
        return self.model(x) @ self.proj


def test_a_model_in_one_unit_is_held_to_no_peers(monkeypatch):
    """TRL's sft.py on a Qwen2 (one top-level unit holding every layer, 2 micro-batches a step,
    gradient checkpointing by SFTConfig's default) read 'it runs 1460 ops a step where the
    model's units run a median 0: a Python loop over items', modelled x9.5 beside the true
    recompute. With no other unit the op count says nothing; the recompute is still named."""
    t = _table(OneUnit(), monkeypatch, accumulate=2)
    (f,) = [f for f in _comp001(t) if f.severity == "warning"]
    assert "(model)" in f.title and "recomputes its forward" in f.message
    assert "loop" not in f.message and f.expected_speedup is not None
    assert f.expected_speedup < 1.6  # a forward recomputed in a step of 4: at most x1.33
    assert f.fix == {"kind": "recompute_off", "values": {}}  # the trial that measures it
    assert any("gpudiag try --fix recompute_off --" in a for a in f.recommendation.actions)


class Broadcast(nn.Module):  # a product by broadcast and sum: a [batch, in, out] intermediate
    def __init__(self, fixed: bool = False) -> None:
        super().__init__()
        self.inp, self.mix, self.head = nn.Linear(32, 64), Mix(fixed), nn.Linear(64, 4)

    def forward(self, x):
        return self.head(torch.relu(self.mix(torch.relu(self.inp(x)))))


class Mix(nn.Module):
    def __init__(self, fixed: bool) -> None:
        super().__init__()
        self.weight, self.fixed = nn.Parameter(torch.randn(64, 64) / 8), fixed

    def forward(self, x):
        return x @ self.weight if self.fixed else (x[:, :, None] * self.weight[None]).sum(1)


class Layers(nn.Module):  # a conv stack (its activations: intermediates it needs) and flat layers
    def __init__(self) -> None:
        super().__init__()
        self.stack = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3)
        )
        self.conv, self.bn = nn.Conv2d(32, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.att = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(self.stack(x))))
        s = h.flatten(2).transpose(1, 2)
        a, _ = self.att(s, s, s)
        return self.head(a.mean(1))


def test_a_layer_that_builds_an_intermediate_far_larger_than_its_result_is_named(monkeypatch):
    """A cause in no catalogue: the product by broadcast and sum moved 21x the bytes its input,
    output and weight need; `x @ W` timed bare x8.05-x10.5 faster (broadcast_matmul.py)."""
    t = _table(Broadcast(), monkeypatch, x=torch.randn(8, 32))
    (f,) = [f for f in _comp001(t) if f.severity == "warning"]
    assert "(mix)" in f.title and "intermediates far larger than its result" in f.message
    fixed = _table(Broadcast(fixed=True), monkeypatch, x=torch.randn(8, 32))
    assert not any("intermediates" in f.message for f in _comp001(fixed))


def test_layers_and_stacks_of_them_build_no_such_intermediate(monkeypatch):
    t = _table(Layers(), monkeypatch, x=torch.randn(8, 3, 12, 12))
    assert not any("intermediates" in f.message for f in _comp001(t))
    assert not next(r for r in t.rows if r.name == "stack").io_bytes  # not a layer


@pytest.mark.parametrize(
    ("shape", "read", "span"),
    [
        ((4, 16, 10), (slice(None), slice(15, 16)), (1, -1, 1)),  # the last position
        ((8, 64), (slice(None), slice(0, 8)), (-1, 0, 8)),  # a Linear's first 8 features
        ((8, 64), (slice(None), slice(None)), None),  # every output read
        ((8, 64), (slice(None), [0, 5]), (-1, 0, 6)),  # first to last (a dead unit inside)
    ],
)
def test_the_span_of_an_output_its_gradient_reaches_is_read(shape, read, span):
    grad = torch.zeros(shape)
    grad[read] = 1.0
    assert gc.read_span(grad) == span


class _LastOf(nn.Module):  # a head over every position, the loss at the last
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(32, 32), nn.Linear(32, 2048)

    def forward(self, x):
        return self.head(self.body(x))[:, -1]


class _Wide(nn.Module):  # a layer 32x wider than the part of it read
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.head = nn.Linear(32, 1024), nn.Linear(32, 4)

    def forward(self, x):
        return self.head(torch.relu(self.inp(x)[:, :32]))


def test_comp001_carries_the_select_trial_over_the_positions_the_loss_reads(monkeypatch):
    t = _table(_LastOf(), monkeypatch, x=torch.randn(8, 16, 32))
    rows = {r.name: r for r in t.rows}
    assert rows["head"].why["read_dim"] == 1 and rows["head"].why["read_start"] == -1
    (f,) = _comp001(t)
    assert "(head)" in f.title
    assert f.fix == {
        "kind": "select",
        "target": "head",
        "values": {"dim": 1, "start": -1, "length": 1},
    }
    assert any(
        "gpudiag try --fix select:head:dim=1,start=-1,length=1" in a
        for a in f.recommendation.actions
    )
    assert not [e for e in f.evidence if e.metric.startswith("compute_read")]  # the trial's


def test_a_span_of_a_layers_features_carries_the_select_trial_over_them(monkeypatch):
    """The trial narrows the layer to its weight's rows read, in the optimizer too (before,
    narrowed by its output alone, it kept the whole weight in the optimizer: no trial)."""
    t = _table(_Wide(), monkeypatch)
    rows = {r.name: r for r in t.rows}
    assert rows["inp"].why["read_dim"] == -1 and rows["inp"].why["read_len"] == 32
    span = {"dim": -1, "start": 0, "length": 32}
    assert trial(rows["inp"], Thresholds()) == {"kind": "select", "target": "inp", "values": span}
    # (its optimizer group's zero gradients may cost more: the layer alone here)
    (f,) = _comp001(replace(t, rows=tuple(r for r in t.rows if r.kind != "optimizer")))
    assert "(inp)" in f.title and f.fix == {"kind": "select", "target": "inp", "values": span}
    assert any("gpudiag try --fix select:inp:dim=-1,start=0,length=32" in a
               for a in f.recommendation.actions)  # fmt: skip


class Attention(nn.Module):  # causal self-attention: written out (planted) or torch's fused form
    def __init__(self, written_out: bool, dim: int = 32, heads: int = 2, p: float = 0.0) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.heads, self.written_out, self.p = heads, written_out, p

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        if self.written_out:
            s = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
            y = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        else:
            p = self.p if self.training else 0.0  # as Hugging Face's sdpa attention
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):  # a unit that calls others: its attention is a part read apart
    def __init__(self, written_out: bool, p: float = 0.0) -> None:
        super().__init__()
        self.attn = Attention(written_out, p=p)
        self.ff = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.ff(x)


class Blocks(nn.Module):
    def __init__(self, written_out: bool, p: float = 0.0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(written_out, p) for _ in range(2))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(dim=1))  # every position read


def test_a_part_of_a_block_that_builds_an_intermediate_is_named_at_its_path(monkeypatch):
    """Attention written out (scores, mask, softmax) inside a block: the block's part
    blocks.N.attn is read apart, its own ops (the projections' left to them) against what it
    takes in and gives out; torch's fused form in the same block is not named."""
    x = torch.randn(8, 256, 32)  # scores of 256 x 256 a head: the part's own time is theirs
    # one intra-op thread: on a busy box two threads on 2 cores wait for each other after
    # every op, which slows the block's products far more than the part's own ops (at load
    # 7-9 the part read no saving in every run; the box's, not the model's)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t = _table(Blocks(True), monkeypatch, x=x)
        fused = _table(Blocks(False), monkeypatch, x=x)
    finally:
        torch.set_num_threads(threads)
    block = next(r for r in t.rows if r.name == "blocks.0")
    assert block.inner["name"] == "blocks.0.attn" and block.inner.get("own_s", 0) > 0
    (f,) = [f for f in _comp001(t) if f.severity == "warning"]
    assert "(blocks." in f.title and "its part blocks." in f.message, f.message
    assert "intermediates far larger than its result" in f.message
    assert "scaled_dot_product_attention" in " ".join(f.recommendation.actions)
    ratio = max(r.inner["bytes"] / r.inner["io"] for r in fused.rows if r.inner)
    assert ratio < 8, ratio  # the fused form's own ops: about its inputs and outputs
    assert not any("own_s" in r.inner for r in fused.rows)  # no part wide: none timed
    assert not any("intermediates" in f.message for f in _comp001(fused))


def test_a_groups_zero_share_reads_a_bounded_sample_of_its_gradients(monkeypatch):
    """A timed step read every element of every gradient (up to ZERO_SAMPLE a tensor) for its
    groups' zero shares: most of its extra time. Now GROUP_ZERO_SAMPLE elements a group, each
    tensor its share of them, and the share and the worst parameter still right."""
    table, bias = torch.zeros(20000, 64), torch.randn(64)
    table[::10] = 1.0  # one row in 10 looked up: 90% of the table's gradient is zero
    params = [nn.Parameter(torch.empty_like(t)) for t in (table, bias)]
    for p, g in zip(params, (table, bias), strict=True):
        p.grad = g
    opt = torch.optim.SGD(params, lr=0.1)
    root = nn.Module()
    root.table, root.bias = params
    read = []
    share = gc.zero_share
    monkeypatch.setattr(
        gc, "zero_share", lambda g, stride=1: read.append(g.numel() // stride) or share(g, stride)
    )
    ((group, zero, worst),) = gc.group_zeros(torch, opt, root)
    assert group == "0" and worst == "table" and zero == pytest.approx(0.9 * 20000 / 20001, 0.02)
    assert sum(read) <= gc.GROUP_ZERO_SAMPLE + len(params), read


@pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_safe_softmax"), reason="torch < 2.5: no mark of SDPA's math"
)
def test_attention_that_already_calls_sdpa_is_told_why_it_ran_unfused(monkeypatch):
    """F.scaled_dot_product_attention with attention dropout in training (Hugging Face's sdpa
    attention: dropout_p=config.attention_probs_dropout_prob): on a CPU no fused kernel takes
    dropout, so it runs its math path, scores written out. The part is named for its
    intermediates, told that it already calls SDPA and that the dropout keeps it unfused (the
    fix: dropout 0), not told to call SDPA in place of written-out scores (run_glue.py's and
    sentence-transformers' MiniLM read so)."""
    x = torch.randn(8, 256, 32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the box's threads waiting on each other: see the test above
    try:
        t = _table(Blocks(False, p=0.1), monkeypatch, x=x)
    finally:
        torch.set_num_threads(threads)
    block = next(r for r in t.rows if r.name == "blocks.0")
    assert block.inner["name"] == "blocks.0.attn"
    assert block.inner.get("fallback") == "sdpa_math_dropout", block.inner
    (f,) = [f for f in _comp001(t) if f.severity == "warning"]
    assert "already calls F.scaled_dot_product_attention" in f.message, f.message
    actions = " ".join(f.recommendation.actions)
    assert "attention dropout 0" in actions and "written-out scores" not in actions, actions
