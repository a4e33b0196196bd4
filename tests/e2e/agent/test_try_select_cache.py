"""`gpudiag try --fix select:UNIT:dim=D,start=S,length=L` (a module over only the outputs the
loss reads) and `cache:MODULE.FUNCTION` (a function's result kept for arguments seen before),
each in a trial's fixed arm: what they change, and the runtime checks that say "not applied"
where the fix would time another job."""

from __future__ import annotations

import pytest

from gpudiag.agent.commands.tryfix import parse_fix
from gpudiag.agent.session.trial import change_line, check_fix
from tests.e2e.agent.trials import in_job

pytest.importorskip("torch")

LM = """
torch.manual_seed(0)
class Cum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
    def forward(self, x):
        return self.lin(x).cumsum(1)  # each position from the ones before it
class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.mix = MIX
        self.head = torch.nn.Linear(8, 40)
    def forward(self, tokens):
        return self.head(self.mix(self.embed(tokens)))
m = LM()
o = torch.optim.SGD(m.parameters(), lr=0.1)
tokens = torch.randint(0, 50, (3, 6))
y = torch.randint(0, 40, (3,))
losses = []
for _ in range(6):
    loss = LOSS
    o.zero_grad(); loss.backward(); o.step()
    losses.append(round(loss.item(), 5))
print(losses)
"""
LAST = "torch.nn.functional.cross_entropy(m(tokens)[:, -1], y)"
EVERY = "torch.nn.functional.cross_entropy(m(tokens).mean(1), y)"


def _lm(mix: str = "torch.nn.Linear(8, 8)", loss: str = LAST) -> str:
    return LM.replace("MIX", mix).replace("LOSS", loss)


def _last_state(steps: str) -> str:
    """The step log's last '# ...' line: what the trial reads (the later line wins)."""
    return [line for line in steps.splitlines() if line.startswith("#")][-1]


SELECT = {"kind": "select", "target": "head", "values": {"dim": 1, "start": -1, "length": 1}}


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        ("select:head:dim=1,start=-1,length=1", SELECT),
        ("cache:train.positional_table", {"kind": "cache", "target": "train.positional_table",
                                          "values": {}}),
    ],
)  # fmt: skip
def test_the_new_fixes_parse_and_pass_the_checks(text, fix):
    assert parse_fix(text) == fix and check_fix(fix, False) is None
    assert change_line(fix, None)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("select:head:dim=1,start=-1,length=0", "length must be a whole number from 1"),
        ("select:head:width=3", "unknown value 'width'"),
        ("cache:train.table:every=2", "unknown value 'every'"),
        ("cache:table", "expected cache:MODULE.FUNCTION"),
    ],
)
def test_bad_select_and_cache_fixes_are_one_line_and_exit_2(cli, text, words):
    r = cli("try", "--fix", text, "--", "python3", "-c", "pass")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_select_computes_the_head_at_the_last_position_and_the_job_learns_the_same(tmp_path):
    plain, _ = in_job(None, _lm(), tmp_path)
    fixed, steps = in_job(SELECT, _lm(), tmp_path)
    assert plain.returncode == 0 and fixed.returncode == 0, fixed.stderr
    assert "# applied: head computes 1 position(s) from -1 along dim 1" in steps
    assert "# not applied" not in steps, steps
    same = eval(plain.stdout)  # the same losses step after step: the same gradients
    assert eval(fixed.stdout) == pytest.approx(same, rel=1e-4), (plain.stdout, fixed.stdout)


def test_select_where_the_loss_reads_every_position_is_said_not_applied(tmp_path):
    out, steps = in_job(SELECT, _lm(loss=EVERY), tmp_path)
    assert out.returncode == 0, out.stderr
    assert "get a nonzero gradient: the loss reads them" in _last_state(steps), steps


def test_select_on_a_module_that_mixes_positions_is_said_not_applied(tmp_path):
    fix = {**SELECT, "target": "mix"}
    out, steps = in_job(fix, _lm(), tmp_path)  # a Linear computes each position alone
    assert out.returncode == 0 and "# not applied" not in steps, out.stderr + steps
    out, steps = in_job(fix, _lm(mix="Cum()"), tmp_path)
    assert out.returncode == 0, out.stderr
    assert "differs when computed over them alone: it mixes positions" in _last_state(steps)


FEATURES = {"kind": "select", "target": "head", "values": {"dim": -1, "start": 0, "length": 10}}
READ_10 = "torch.nn.functional.cross_entropy(m(tokens)[:, -1, :10], y % 10)"
OPT_SIZE = "\nprint(sum(p.numel() for g in o.param_groups for p in g['params']))\n"


def test_select_along_features_says_the_change_is_a_narrower_layer():
    assert "make head a layer of the 10 output features read" in change_line(FEATURES, None)
    assert "select before it (e.g. head(x[:, -1])" in change_line(SELECT, None)


def test_select_along_a_linears_features_narrows_it_and_its_optimizer(tmp_path):
    """The loss reads 10 of the head's 40 features: after 3 backwards that show the other 30
    unread, the layer is narrowed to its weight's 10 rows, in the optimizer too (its moments
    cut the same way), and the job learns the same (Adam: state narrowed mid-run)."""
    body = _lm(loss=READ_10).replace("SGD(m.parameters(), lr=0.1)", "Adam(m.parameters())")
    body = body.replace("range(6)", "range(8)") + OPT_SIZE
    plain, _ = in_job(None, body, tmp_path)
    fixed, steps = in_job(FEATURES, body, tmp_path)
    assert plain.returncode == 0 and fixed.returncode == 0, fixed.stderr
    assert "# not applied" not in steps, steps
    assert "head narrowed to 10 of its 40 output features" in steps, steps
    (same, whole), (got, held) = (o.stdout.strip().splitlines() for o in (plain, fixed))
    assert eval(got) == pytest.approx(eval(same), rel=1e-4), (same, got)
    assert int(whole) - int(held) == 30 * 8 + 30  # the optimizer holds the narrower layer


@pytest.mark.parametrize(
    ("head", "loss", "said"),
    [
        ("torch.nn.Sequential(torch.nn.Linear(8, 40))", READ_10,
         "is tried on a torch.nn.Linear only (its weight"),
        ("torch.nn.Linear(8, 40)", EVERY, "get a nonzero gradient: the loss reads them"),
    ],
    ids=["not a linear", "every feature read"],
)  # fmt: skip
def test_select_along_features_it_cannot_narrow_is_said_not_applied(tmp_path, head, loss, said):
    body = _lm(loss=loss).replace("torch.nn.Linear(8, 40)", head)
    plain, _ = in_job(None, body, tmp_path)
    fixed, steps = in_job(FEATURES, body, tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert said in _last_state(steps), steps
    assert eval(fixed.stdout) == pytest.approx(eval(plain.stdout), rel=1e-4)


def test_select_of_a_tied_linear_is_said_not_applied(tmp_path):
    body = _lm(loss=READ_10).replace("m = LM()", "m = LM(); m.head.weight = m.embed.weight")
    body = body.replace("torch.nn.Linear(8, 40)", "torch.nn.Linear(8, 50)")
    fixed, steps = in_job(FEATURES, body, tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert "its weight is also another module's (embed.weight)" in _last_state(steps), steps


POS = """
torch.manual_seed(0)
built = []
def positional_table(t, d):
    built.append(t)
    return torch.stack([torch.full((d,), float(i)) for i in range(t)])
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
    def forward(self, x):
        return self.lin(x + positional_table(x.shape[1], 4))
m = M(); o = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(14):
    x = torch.randn(2, LEN(i), 4)
    m(x).sum().backward(); o.step()
print(len(built))
"""


def test_cache_builds_a_table_of_the_same_arguments_once(tmp_path):
    out, steps = in_job(
        {"kind": "cache", "target": "__main__.positional_table", "values": {}},
        POS.replace("LEN(i)", "5"),
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1", out.stdout
    assert "calls served from the cache" in steps and "# not applied" not in steps, steps


def test_cache_of_a_function_whose_arguments_change_is_said_not_applied(tmp_path):
    out, steps = in_job(
        {"kind": "cache", "target": "__main__.positional_table", "values": {}},
        POS.replace("LEN(i)", "i + 1"),
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "14"
    assert "arguments or results do not repeat: 0 of 14" in _last_state(steps), steps
