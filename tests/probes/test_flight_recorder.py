"""Reading NCCL flight-recorder dumps (the dict PyTorch pickles per rank on a watchdog
timeout): the last collective each rank entered and completed; data only, never a crash."""

from __future__ import annotations

import json
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from gpudiag.probes.dist.flight_recorder import load_dump, read_dumps, summarise


def entry(seq: int, state: str, name: str = "nccl:all_reduce", pg: str = "0") -> dict:
    """One entry as torch/distributed/flight_recorder/components/builder.py documents it."""
    return {
        "record_id": seq,
        "pg_id": 0,
        "process_group": (pg, "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": name,
        "time_created_ns": 1_000 * seq,
        "input_sizes": [[1024]],
        "output_sizes": [[1024]],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "frames": [{"name": "all_reduce", "filename": "train.py", "line": 30}],
    }


def dump(entries: list[dict]) -> dict:
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "ranks": "[0, 1]"}},
        "entries": entries,
    }


def write_dumps(tmp_path, per_rank: dict[int, list[dict]], as_json: bool = False) -> str:
    prefix = str(tmp_path / "nccl_trace_rank_")
    for rank, entries in per_rank.items():
        data = json.dumps(dump(entries)).encode() if as_json else pickle.dumps(dump(entries))
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(data)
    return prefix


def test_pickled_dumps_give_each_ranks_last_entered_and_completed(tmp_path):
    prefix = write_dumps(
        tmp_path,
        {
            0: [entry(11, "completed"), entry(12, "started")],
            1: [entry(10, "completed"), entry(11, "completed")],
        },
    )
    got = read_dumps(prefix, [0, 1])
    assert got[0].last_entered == (12, "nccl:all_reduce") and got[0].last_completed[0] == 11
    assert got[0].pending == 1
    assert got[1].last_entered == (11, "nccl:all_reduce") and got[1].pending == 0


def test_json_dumps_read_too_and_old_dumps_are_skipped(tmp_path):
    prefix = write_dumps(tmp_path, {0: [entry(3, "scheduled")]}, as_json=True)
    assert read_dumps(prefix, [0])[0].last_entered == (3, "nccl:all_reduce")
    assert read_dumps(prefix, [0], since=4e9) == {}  # written before this session


def test_a_pickle_that_names_a_class_or_function_is_refused():
    class Evil:
        def __reduce__(self):
            return (print, ("executed",))

    assert load_dump(pickle.dumps({"entries": [Evil()]})) is None
    assert load_dump(b"\x80\x04junk") is None


def test_only_the_first_process_group_counts():
    doc = dump([entry(5, "completed"), entry(9, "started", pg="1")])
    s = summarise(doc, 0)
    assert s.last_entered == (5, "nccl:all_reduce") and s.pending == 0


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_give_a_summary_or_nothing(data):
    doc = load_dump(data)
    assert doc is None or isinstance(doc, dict)
    if doc is not None:
        summarise(doc, 0)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["collective_seq_id", "state", "process_group", "profiling_name"]),
            st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers())),
        ),
        max_size=5,
    )
)
def test_malformed_entries_never_crash(entries):
    summarise({"entries": entries}, 0)
