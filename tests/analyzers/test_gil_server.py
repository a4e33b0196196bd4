"""One cause, one id: a server's request handlers holding the GIL is the request path's own
work (SERVE002's host work, or the forwards SERVE001 batches), not GIL001's.

The recordings are two `gpudiag run` looks at the planted Flask server tokenizing in Python on
its handler threads (`tests/workloads/serve_flask.py --healthy --tokenize`, 4 clients, the
2-core box at load 0.7-1.1). Before, both read GIL001 alone ("other Python threads hold the GIL
84%": the handler threads, one to three ticks each) and no SERVE002: its 144 and 140 busy
samples were under min_loop_samples.
"""

from __future__ import annotations

import pytest

from gpudiag.analyzers.findings.gil import _without
from gpudiag.analyzers.measures.loop import GilStats
from tests.analyzers.recorded import replay_workload


@pytest.mark.parametrize("name", ["flask_tokenizer_gil_1", "flask_tokenizer_gil_2"])
def test_handlers_holding_the_gil_is_serve002_not_gil001(name):
    doc = replay_workload(name)
    ids = [f["id"] for f in doc["findings"]]
    assert ids[0] == "SERVE002" and "GIL001" not in ids, ids
    assert doc["findings"][0]["location"].endswith(":tokenize")


def gil(holders, other: float, wait: float) -> GilStats:
    return GilStats(200, 0.1, other, tuple(holders), 0.8, 0.1, wait, 10, 10.0, None)


def test_a_background_thread_beside_the_handlers_is_still_named():
    g = gil([("Thread-9 (process_request_thread)", 0.3, ""), ("metrics", 0.4, "")], 0.7, 0.35)
    out = _without(g, frozenset({"Thread-9 (process_request_thread)"}))
    assert [h[0] for h in out.holders] == ["metrics"]
    assert out.other_share == pytest.approx(0.4)
    assert out.wait_share == pytest.approx(0.2)  # the wait scaled with the others' hold


def test_no_handlers_leaves_the_gil_stats_as_they_are():
    g = gil([("metrics", 0.4, "")], 0.4, 0.3)
    assert _without(g, frozenset()) is g
    assert _without(g, frozenset({"Thread-1 (process_request_thread)"})) is g
