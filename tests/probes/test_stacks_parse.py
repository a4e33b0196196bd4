"""Parsing py-spy output and explaining its errors."""

from __future__ import annotations

from gpudiag.probes.stacks.pyspy import diagnose_py_spy_error
from gpudiag.probes.stacks.pyspy_output import episode_anchor, parse_raw, parse_speedscope

LIB = "/venv/lib/python3.11/site-packages"


def test_parse_raw_with_process_and_thread_frames():
    lines = [
        'process 42:"python train.py --lr 0.1";thread (43): MainThread;'
        "<module> (/w/train.py:9);step (/w/train.py:3) 17\n",
        "thread (0x7f00): worker;run (/w/t.py:1) 2\n",
        "\n",
        "garbage\n",
    ]
    rows = parse_raw(lines, default_pid=1)
    assert rows[0].pid == 42 and rows[0].tid == 43 and rows[0].thread == "MainThread"
    assert rows[0].frames == ("<module> (/w/train.py:9)", "step (/w/train.py:3)")
    assert rows[0].count == 17
    assert rows[1].pid == 1 and rows[1].tid == 0x7F00 and rows[1].count == 2
    assert len(rows) == 2


def test_parse_speedscope_counts_and_episodes():
    frames = [
        {"name": "<module>", "file": "/w/train.py", "line": 9},
        {"name": "save", "file": f"{LIB}/torch/serialization.py", "line": 600},
        {"name": "save", "file": f"{LIB}/torch/serialization.py", "line": 610},
        {"name": "step", "file": "/w/train.py", "line": 3},
    ]
    seq = [[0, 3], [0, 1], [0, 2], [0, 3], [0, 3], [0, 1], [0, 3]]
    doc = {
        "shared": {"frames": frames},
        "profiles": [
            {"name": 'Process 7 Thread 8 "MainThread"', "samples": seq},
            {"name": 'Process 9 Thread 9 "MainThread"', "samples": [[0, 1]]},
        ],
    }
    rows, episodes = parse_speedscope(doc, default_pid=7)
    main = {r.frames: r.count for r in rows if r.pid == 7}
    assert main[("<module> (/w/train.py:9)", "step (/w/train.py:3)")] == 4
    assert len(rows) == 4
    saves = [e for e in episodes if "serialization" in e.anchor]
    assert len(saves) == 1 and saves[0].episodes == 2 and saves[0].count == 3
    assert all(e.pid == 7 for e in episodes)  # children's episodes are not tracked


def test_episode_anchor_drops_the_library_line():
    stack = (
        "<module> (/w/train.py:9)",
        f"save ({LIB}/torch/serialization.py:600)",
        f"_save ({LIB}/torch/serialization.py:700)",
    )
    assert episode_anchor(stack) == (
        f"<module> (/w/train.py:9);save ({LIB}/torch/serialization.py)"
    )
    assert episode_anchor(("<module> (/w/train.py:9)",)) is None


def test_py_spy_errors_are_explained():
    reason, hint = diagnose_py_spy_error("Error: Permission denied (os error 13)", 5)
    assert "permission" in reason and "ptrace" in hint
    reason, _ = diagnose_py_spy_error("Error: Failed to find python version from target", 5)
    assert "not a Python process" in reason


def _speedscope(path, pid: int, stacks: list[tuple[list[str], int]]) -> None:
    import json

    names = sorted({f for st, _ in stacks for f in st})
    frames = [{"name": n, "file": "/w/x.py", "line": 1} for n in names]
    samples = [[names.index(f) for f in st] for st, n in stacks for _ in range(n)]
    doc = {
        "shared": {"frames": frames},
        "profiles": [{"name": f'Thread {pid} "MainThread"', "samples": samples}],
    }
    path.write_text(json.dumps(doc))


def test_workers_recorded_in_turns_are_weighted_to_stand_for_all_workers(tmp_path):
    from gpudiag.analyzers.timeline.timeline import Timeline
    from gpudiag.probes.base import Target
    from gpudiag.probes.stacks.probe import StackProbe
    from gpudiag.probes.stacks.pyspy import SpyRun

    probe = StackProbe()
    probe.target = Target(100)
    tl = Timeline()
    # two windows, each recording one of 4 workers at 10 Hz beside the loop at 50 Hz;
    # the workers decode 3/4 of the time and wait 1/4, whatever their raw counts
    for n, (worker, raw) in enumerate([(201, 40), (202, 20)]):
        loop = SpyRun("all", 100, 50, str(tmp_path / f"{n}-all.json"))
        _speedscope(tmp_path / f"{n}-all.json", 100, [(["main", "step"], 150)])
        w = SpyRun("worker", worker, 10, str(tmp_path / f"{n}-w.json"))
        _speedscope(
            tmp_path / f"{n}-w.json",
            worker,
            [(["_worker_loop", "decode"], raw * 3 // 4), (["_worker_loop", "get"], raw // 4)],
        )
        assert probe._collect([loop, w], alive=4, duration=3.0)
        samples = probe.sample()
        rows = [s for s in samples if s.labels.get("role") == "worker"]
        assert {s.labels["mode"] for s in rows} == {"all"} and rows[0].labels["pid"] == str(worker)
        assert all(s.values["weight"] == 4 * 50 / 10 for s in rows)
        assert sum(s.values["count"] for s in rows) == raw * 20
        windows = [s for s in samples if s.labels.get("kind") == "window"]
        assert sorted(s.labels["mode"] for s in windows) == ["all", "workers"]
        tl.extend(samples)
    counts = {
        st.split(";")[-1].split(" ")[0]: c
        for key in tl.threads("all", "worker")
        for (st, _), c in tl.stacks[key].items()
    }
    assert counts["decode"] / (counts["decode"] + counts["get"]) == 0.75
    assert tl.windows["all"].ticks == 300  # the loop's ticks are not counted twice
