"""check_value checks lists of numbers in bulk (a recording holds millions): the bulk path
must refuse exactly what the item-by-item one refuses."""

from __future__ import annotations

import pytest

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.base.safeio import MAX_INT_DIGITS, check_value

NAN, INF = float("nan"), float("inf")
BIG = 10**MAX_INT_DIGITS


@pytest.mark.parametrize(
    "value",
    [[NAN, BIG], [BIG, NAN], [1, NAN, -BIG], [[1, 2.5], [3, BIG]], {"a": [True, BIG]}, BIG],
)
def test_a_huge_integer_is_refused_wherever_it_sits(value):
    with pytest.raises(UsageError, match=f"integer of {MAX_INT_DIGITS + 1} digits"):
        check_value(value, "w", allow_nonfinite=True)


def test_non_finite_numbers_only_where_allowed():
    for value in ([1, 2, INF], [[0.5], [NAN]], {"x": -INF}):
        check_value(value, "w", allow_nonfinite=True)
        with pytest.raises(UsageError, match="non-finite"):
            check_value(value, "w")


def test_large_floats_and_mixed_lists_pass():
    check_value([1e300, -1e300, 3, True, None, "9" * 40, {"k": [BIG - 1]}], "w")
