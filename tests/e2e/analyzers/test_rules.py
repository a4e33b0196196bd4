"""End to end: frame rules: what category real py-spy stacks fall in, and user rules."""

from __future__ import annotations

from gpudiag.analyzers.measures.rules import (
    Classifier,
)
from tests.analyzers.scenario import STD


def test_waiting_and_io_stacks():
    assert Classifier.is_waiting(f"a (/w.py:1);Queue.get ({STD}/multiprocessing/queues.py:113)")
    assert not Classifier.is_waiting("a (/w.py:1);b (/w.py:2)")
    assert Classifier.is_io("a (/w.py:1)", "data = np.load(path)")
    assert not Classifier.is_io("a (/w.py:1)", "img = img.flip(2)")
