"""In-process hooks: exact step counts, agreement with stacks, and never hurting the job."""

from __future__ import annotations

import pytest

from gpudiag.probes.inprocess.channel import parse_message

pytest.importorskip("torch")


def test_parse_message_ignores_garbage():
    assert parse_message({"steps": [[1.0, 0.1]], "sites": None}) == []
    samples = parse_message(
        {"steps": [[1.0, None, 0, 0, 0, 0, 0, 0, 0], [1.1, 0.1, 0.02, 32, 0, 0, 0, 2, 0.01]]}
    )
    assert samples[0].values == {"first_step": 1.0}
    assert samples[1].values["data_wait_s"] == 0.02 and samples[1].values["syncs"] == 2
