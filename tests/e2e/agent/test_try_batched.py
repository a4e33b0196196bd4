"""`gpudiag try --fix batched:UNIT`: a module called once per sample, on slices of one batch,
computed once on the whole batch in a trial's fixed arm; what it changes (nothing the job
learns: the same losses), and the runtime checks that say "not applied" where it would time
another job (a module that mixes samples, calls that are no loop over a batch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpudiag.agent.commands.tryfix import parse_fix
from gpudiag.agent.session.trial import change_line, check_fix
from gpudiag.probes.inprocess.channel import injection_env
from tests.e2e.agent.trials import in_job, steps_log

pytest.importorskip("torch")

JOB = """
torch.manual_seed(0)
runs = []
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = ENCODER
        self.encoder[0].register_forward_hook(lambda *a: runs.append(a[1][0].shape[0]))
        self.head = torch.nn.Linear(8, 3)
    def forward(self, x):
        return self.head(LOOP)
m = M()
o = torch.optim.Adam(m.parameters(), lr=0.01)
x, y = torch.randn(BATCH, 8), torch.randint(0, 3, (ROWS,))
losses = []
for _ in range(6):
    loss = torch.nn.functional.cross_entropy(m(x), y)
    o.zero_grad(); loss.backward(); o.step()
    losses.append(round(loss.item(), 5))
print(losses)
print(len(runs))
"""
MLP = "torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))"
PER_ROW = "torch.cat([self.encoder(x[i : i + 1]) for i in range(x.shape[0])])"
PAIRS = "torch.cat(list(map(self.encoder, x.split(2))))"


def _job(encoder: str = MLP, loop: str = PER_ROW, batch: int = 16, rows: int = 16) -> str:
    """The job: `loop` calls `encoder` over a batch of `batch` samples, the loss over `rows`."""
    job = JOB
    for k, v in (("ENCODER", encoder), ("LOOP", loop), ("BATCH", batch), ("ROWS", rows)):
        job = job.replace(k, str(v))
    return job


def _out(text: str) -> tuple[list[float], int]:
    losses, runs = text.strip().splitlines()
    return eval(losses), int(runs)


def _last_state(steps: str) -> str:
    """The step log's last '# ...' line: what the trial reads (the later line wins)."""
    return [line for line in steps.splitlines() if line.startswith("#")][-1]


FIX = {"kind": "batched", "target": "encoder", "values": {}}


def test_batched_parses_and_passes_the_checks():
    assert parse_fix("batched:encoder") == FIX and check_fix(FIX, False) is None
    assert "once on the whole batch" in change_line(FIX, None)


@pytest.mark.parametrize(
    ("text", "words"),
    [("batched:encoder:factor=2", "unknown value 'factor'"), ("batched:1x", "expected batched:")],
)
def test_bad_batched_fixes_are_one_line_and_exit_2(cli, text, words):
    r = cli("try", "--fix", text, "--", "python3", "-c", "pass")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


@pytest.mark.parametrize(
    "loop",
    [PER_ROW, "torch.stack([self.encoder(s) for s in x])", PAIRS],
    ids=["slices", "rows", "pairs"],
)
def test_a_loop_over_a_batchs_samples_runs_once_a_step_and_learns_the_same(tmp_path, loop):
    plain, _ = in_job(None, _job(loop=loop), tmp_path)
    fixed, steps = in_job(FIX, _job(loop=loop), tmp_path)
    assert plain.returncode == 0 and fixed.returncode == 0, fixed.stderr
    (same, runs), (got, fewer) = _out(plain.stdout), _out(fixed.stdout)
    assert got == pytest.approx(same, rel=1e-4, abs=1e-5)  # the same gradients, step after step
    assert "# not applied" not in steps and "computed once on the batch" in steps, steps
    # the first step learns (a call per sample until half the batch is seen), then one batched
    # call a step (the rest of the first step's too) and the first 3 served calls checked
    assert fewer <= runs // 6 + 6 + 3, (runs, fewer)
    assert "served from 6 batched calls" in _last_state(steps), steps


def test_a_module_that_mixes_samples_is_said_not_applied_and_runs_as_it_is(tmp_path):
    norm = "torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))"
    # (batch norm needs 2 rows a call in training)
    plain, _ = in_job(None, _job(norm, PAIRS), tmp_path)
    fixed, steps = in_job(FIX, _job(norm, PAIRS), tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert "it mixes samples (batch norm in training" in _last_state(steps), steps
    # the check's extra calls aside (they move the running statistics only), the same losses
    assert _out(fixed.stdout)[0] == pytest.approx(_out(plain.stdout)[0], rel=1e-4, abs=1e-5)


def test_calls_on_a_few_rows_of_a_larger_tensor_are_no_loop_and_said_not_applied(tmp_path):
    few = "torch.cat([self.encoder(x[i : i + 1]) for i in range(4)])"  # 4 of 64 rows
    fixed, steps = in_job(FIX, _job(loop=few, batch=64, rows=4), tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert "no step called it on 4 or more slices of one batch covering half" in steps, steps
    assert _out(fixed.stdout)[1] == 6 * 4  # every call its own


def test_a_batch_written_between_the_calls_is_computed_again_not_served_stale(tmp_path):
    """Each row of the batch is written just before its call: a batched output computed at
    the first call would be stale for the later rows; the base's version says so. (The
    encoder saves no input for its backward, tanh its output: writing a saved input between
    the calls fails the job as it is.)"""
    writes = (
        "torch.cat([self.encoder(x[i : i + 1]) for i in range(x.shape[0])"
        " if x[i : i + 1].add_(0.5) is not None])"
    )
    tanh_first = "torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(8, 8))"
    plain, _ = in_job(None, _job(tanh_first, writes), tmp_path)
    fixed, steps = in_job(FIX, _job(tanh_first, writes), tmp_path)
    assert plain.returncode == 0 and fixed.returncode == 0, fixed.stderr
    assert _out(fixed.stdout)[0] == pytest.approx(_out(plain.stdout)[0], rel=1e-4, abs=1e-5)
    assert "# not applied" not in steps, steps  # (a stale row would fail the first checks)


HOOKS_LEFT = """
import torch
from torch.nn.modules import module as nn_module
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
o = torch.optim.Adam(m.parameters())
x = torch.randn(16, 8)
for i in range(4):
    loss = torch.cat([m(x[j : j + 1]) for j in range(16)]).sum()
    o.zero_grad(); loss.backward(); o.step()
print(len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks))
"""


@pytest.mark.parametrize("fix", [None, FIX], ids=["as is", "batched"])
def test_an_arms_module_calls_run_without_gpudiags_global_forward_hooks(tmp_path, fix):
    """A try arm (the hooks in, no agent) of a training job: after its first steps no global
    forward hook of gpudiag's is left (each module call paid them: a loop of 128 calls a step
    ran slower in both arms than the bare job, the trial's batched arm most against its bare
    fix)."""
    env = injection_env(dict(os.environ), str(tmp_path / "no-agent.sock"))
    env["GPUDIAG_TRY_STEPS"] = str(steps_log(tmp_path))
    if fix is not None:
        env["GPUDIAG_FIX"] = json.dumps({**fix, "target": "0"})
    out = subprocess.run(
        [sys.executable, "-c", HOOKS_LEFT], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "0"], out.stdout
