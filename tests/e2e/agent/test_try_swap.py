"""`gpudiag try --fix swap:MODULE.FUNCTION:with=OTHER.FUNCTION`: a rewrite the user wrote run in
place of the job's function in a trial's fixed arm (no edit of the job), checked equal to the
original on its first calls, and "not applied" where it is not the same computation."""

from __future__ import annotations

import pytest

from gpudiag.agent.commands.tryfix import parse_fix
from gpudiag.agent.session.trial import change_line, check_fix
from tests.e2e.agent.trials import in_job

pytest.importorskip("torch")

JOB = """
import torch
torch.manual_seed(0)
class Pool(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    def forward(self, x):
        h = torch.relu(self.inp(x))
        pooled = torch.stack([h[:, : i + 1].mean(dim=1) for i in range(h.shape[1])], dim=1)
        return self.head(pooled.mean(dim=1))
m = Pool(); o = torch.optim.Adam(m.parameters(), lr=0.01)
x, y = torch.randn(3, 12, 4), torch.randint(0, 2, (3,))
losses = []
for _ in range(8):
    loss = torch.nn.functional.cross_entropy(m(x), y)
    o.zero_grad(); loss.backward(); o.step()
    losses.append(round(loss.item(), 5))
print(losses)
"""
FAST = """
import torch
calls = []
def forward(self, x):
    calls.append(1)
    h = torch.relu(self.inp(x))
    t = h.shape[1]
    pooled = h.cumsum(dim=1) / torch.arange(1, t + 1).view(1, t, 1)
    return self.head(pooled.mean(dim=1)) SCALE
"""
FIX = {"kind": "swap", "target": "job.Pool.forward", "values": {"with": "fast.forward"}}


def _last_state(steps: str) -> str:
    return [line for line in steps.splitlines() if line.startswith("#")][-1]


def test_swap_parses_and_passes_the_checks():
    assert parse_fix("swap:job.Pool.forward:with=fast.forward") == FIX
    assert check_fix(FIX, False) is None
    assert "replace job.Pool.forward with fast.forward" in change_line(FIX, None)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("swap:job.Pool.forward", "needs with=MODULE.FUNCTION"),
        ("swap:job.Pool.forward:with=3", "with must be a function's dotted name"),
        ("swap:job.f:every=2", "unknown value 'every'"),
    ],
)
def test_bad_swap_fixes_are_one_line_and_exit_2(cli, text, words):
    r = cli("try", "--fix", text, "--", "python3", "-c", "pass")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_a_rewrite_in_a_file_beside_the_job_runs_in_its_place_and_learns_the_same(tmp_path):
    (tmp_path / "fast.py").write_text(FAST.replace("SCALE", ""))
    plain, _ = in_job(None, "", tmp_path, script=JOB)
    fixed, steps = in_job(FIX, "", tmp_path, script=JOB)
    assert plain.returncode == 0 and fixed.returncode == 0, fixed.stderr
    assert eval(fixed.stdout) == pytest.approx(eval(plain.stdout), rel=1e-4)
    assert "# not applied" not in steps, steps
    assert "runs fast.forward in its place" in steps and "8 of 8 calls" in steps, steps


def test_a_rewrite_that_computes_something_else_is_said_not_applied(tmp_path):
    (tmp_path / "fast.py").write_text(FAST.replace("SCALE", "* 1.01"))
    plain, _ = in_job(None, "", tmp_path, script=JOB)
    fixed, steps = in_job(FIX, "", tmp_path, script=JOB)
    assert fixed.returncode == 0, fixed.stderr
    assert "fast.forward's result is not job.Pool.forward's: its values differ" in _last_state(
        steps
    ), steps
    assert eval(fixed.stdout) == pytest.approx(eval(plain.stdout), rel=1e-6)  # the job as is


def test_a_replacement_not_found_is_said_not_applied(tmp_path):
    fixed, steps = in_job({**FIX, "values": {"with": "nowhere.forward"}}, "", tmp_path, script=JOB)
    assert fixed.returncode == 0, fixed.stderr
    assert "no function nowhere.forward found" in _last_state(steps), steps
