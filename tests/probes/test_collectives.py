"""The collective hooks' datagrams: samples, each rank's latest state, rank labels."""

from __future__ import annotations

import json

from gpudiag.probes.dist.collectives import RankLabels, parse_dist
from gpudiag.probes.inprocess.channel import HookProbe, decode_datagram, parse_message

MSG = {
    "v": 2,
    "pid": 4242,
    "dist": {
        "env": {"rank": "1", "local_rank": "1", "world_size": "2"},
        "seq": 12,
        "done": 11,
        "ops": {"all_reduce": [10, 0.5], "barrier": [2, 0.1]},
        "steps": [[1700000000.0, 0.04, 4, 8], [1700000000.1, 0.05, 4, 12]],
        "inside": {"op": "all_reduce", "seq": 12, "since_s": 3.5},
        "t": 1700000001.0,
    },
}


def test_datagram_gives_step_and_op_samples_with_declared_fields():
    samples, state = parse_dist(decode_datagram(json.dumps(MSG).encode()))
    steps = [s for s in samples if s.labels["kind"] == "collective_step"]
    assert [s.values["collective_s"] for s in steps] == [0.04, 0.05]
    ops = {
        s.labels["op"]: s.values["calls"] for s in samples if s.labels["kind"] == "collective_op"
    }
    assert ops == {"all_reduce": 10.0, "barrier": 2.0}
    declared = {f.name for f in HookProbe.fields}
    assert all(set(s.values) <= declared for s in samples)
    assert state.rank == 1 and state.inside_op == "all_reduce" and state.inside_seq == 12


def test_samples_are_labelled_by_rank_and_steps_counted():
    labels = RankLabels()
    labels.enabled = True
    out = labels.tag(MSG, [])
    assert out and all(s.labels["rank"] == "1" for s in out)
    step_msg = {"v": 2, "pid": 4242, "width": 9, "steps": [[1.0, 0.1, 0, 1, 0, 0, 0, 0, 0]]}
    out = labels.tag(step_msg, parse_message(step_msg))
    assert out[0].labels == {"kind": "step", "rank": "1"}
    assert labels.steps[1] == 1 and labels.states[1].seq == 12


def test_unknown_process_stays_unlabelled():
    msg = {"v": 2, "pid": 7, "width": 9, "steps": [[1.0, 0.1, 0, 1, 0, 0, 0, 0, 0]]}
    labels = RankLabels()
    labels.enabled = True
    out = labels.tag(msg, parse_message(msg))
    assert out[0].labels == {"kind": "step"}


def test_a_session_not_following_ranks_keeps_its_samples_unlabelled():
    out = RankLabels().tag(MSG, [])  # a job that set RANK itself, profiled as one process
    assert out and all("rank" not in s.labels for s in out)


def test_malformed_dist_parts_are_skipped():
    bad = {"pid": 1, "dist": {"steps": [["x"], [1, 2]], "ops": {"a": "b"}, "inside": 5}}
    samples, state = parse_dist(bad)
    assert samples == [] and state is not None and state.inside_op is None
