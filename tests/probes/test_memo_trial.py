"""`gpudiag try --fix cache:MODULE.FUNCTION` inside the job (gpudiag_callsite.Memo): a call with
arguments seen before returns the kept result, the hit rate is said, and a function whose
arguments change is said not applied instead of timing another job."""

from __future__ import annotations

import pytest

from gpudiag.probes.inject import gpudiag_callsite

torch = pytest.importorskip("torch")


def _memo(fn):
    """fn patched in place by a Memo; (the memo, the lines it said, the calls that ran)."""
    notes: list[str] = []
    memo = gpudiag_callsite.Memo("x.fn", notes.append)
    assert memo.patch_function(fn) is None
    return memo, notes


def test_a_function_called_with_the_same_numbers_runs_once_and_says_its_hit_rate():
    ran = []

    def table(t: int, d: int) -> torch.Tensor:
        ran.append((t, d))
        return torch.arange(t * d, dtype=torch.float32).view(t, d)

    memo, _ = _memo(table)
    first = table(4, 2)
    got = [table(4, 2) for _ in range(11)]
    assert ran == [(4, 2)] and all(g is first for g in got)
    assert memo.state() == (
        "# applied: x.fn returns its kept result when called again with the same arguments "
        "(tests.probes.test_memo_trial.test_a_function_called_with_the_same_numbers_runs_once_"
        "and_says_its_hit_rate.<locals>.table): 11 of 12 calls served from the cache (92%), 1 "
        "argument set(s) kept"
    )


def test_a_function_whose_arguments_change_is_said_not_applied():
    def square(n: int) -> int:
        return n * n

    memo, _ = _memo(square)
    assert [square(i) for i in range(12)] == [i * i for i in range(12)]
    line = memo.state()
    assert line.startswith("# not applied: x.fn's arguments or results do not repeat: 0 of 12")


def test_a_tensor_argument_matches_itself_unchanged_or_its_values_never_a_change():
    ran = []

    def double(x: torch.Tensor) -> torch.Tensor:
        ran.append(1)
        return x * 2

    _memo(double)
    x = torch.ones(3)
    double(x)
    double(x)  # the same tensor, unchanged: kept
    double(torch.ones(3))  # another tensor of the same values: kept
    x.add_(1)  # written in place: its values changed, run again
    assert double(x).tolist() == [4.0, 4.0, 4.0]
    assert len(ran) == 2


def test_a_result_that_needs_a_gradient_or_was_written_in_place_is_not_served():
    w = torch.ones(2, requires_grad=True)

    def scaled(k: int) -> torch.Tensor:
        return w * k

    memo, _ = _memo(scaled)
    a, b = scaled(2), scaled(2)
    assert a is not b and memo.hits == 0
    assert "2 result(s) not kept: its result needs a gradient" in memo.state()

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n)

    memo, _ = _memo(zeros)
    z = zeros(2)
    z.add_(5)  # the caller changed what it got: a later call must not see it
    assert zeros(2).tolist() == [0.0, 0.0] and memo.hits == 0
