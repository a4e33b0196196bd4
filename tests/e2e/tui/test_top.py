"""End to end: `gpudiag top` on a box without a GPU: says so, lists Python processes, attaches with
`a`."""

from __future__ import annotations

import asyncio

import pytest

from gpudiag.tui.top import TopApp
from tests.tui.test_top import NO_GPU


def procs(order):
    rows = {
        1: {
            "pid": 101,
            "user": "u",
            "command": "python train.py",
            "gpus": "-",
            "cpu": 90.0,
            "rss": 2**30,
            "python": True,
        },
        2: {
            "pid": 202,
            "user": "u",
            "command": "python eval.py",
            "gpus": "-",
            "cpu": 10.0,
            "rss": 2**29,
            "python": True,
        },
        3: {
            "pid": 303,
            "user": "u",
            "command": "nginx",
            "gpus": "0:1.0GiB",
            "cpu": 1.0,
            "rss": 2**20,
            "python": False,
        },
    }
    return [rows[i] for i in order]


def test_attach_follows_the_selected_process_across_refreshes():
    boxes = [dict(NO_GPU, processes=procs([1, 2, 3])), dict(NO_GPU, processes=procs([2, 1, 3]))]
    state = {"i": 0}
    app = TopApp(lambda: boxes[min(state["i"], 1)])

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            await pilot.press("down")  # python eval.py (202)
            state["i"] = 1
            app.tick()  # the order changes under the cursor
            await pilot.pause()
            await pilot.press("a")
            await pilot.pause()
            assert app.is_running and app.asking == 202  # the question first
            await pilot.press("n")
            await pilot.pause()

    asyncio.run(go())
    assert app.return_value == (202, False)


@pytest.mark.parametrize(("keys", "value"), [("ay", (101, True)), ("a", None)])
def test_attach_asks_before_loading_the_hooks(keys, value):
    app = TopApp(lambda: dict(NO_GPU, processes=procs([1])))

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            await pilot.press(*keys)
            await pilot.pause()
            if app.is_running:
                await pilot.press("escape", "y")  # cancelled: a late `y` does nothing
                await pilot.pause()
                assert app.is_running
                await pilot.press("q")

    asyncio.run(go())
    assert app.return_value == value


def test_attach_refuses_a_non_python_process():
    app = TopApp(lambda: dict(NO_GPU, processes=procs([3])))

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause()
            await pilot.press("a")
            await pilot.pause()
            assert app.is_running
            await pilot.press("q")

    asyncio.run(go())
    assert app.return_value is None


def test_box_sampler_lists_python_processes_and_says_there_is_no_gpu():
    import subprocess
    import sys
    import time

    from gpudiag.probes.box import BoxSampler

    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    sampler = BoxSampler()
    try:
        time.sleep(0.3)
        box = sampler.snapshot()
    finally:
        sampler.close()
        job.kill()
        job.wait()
    row = next(p for p in box["processes"] if p["pid"] == job.pid)
    assert row["python"] and "time.sleep(30)" in row["command"]
    if not box["gpu_status"]["available"]:
        assert box["gpus"] == [] and box["gpu_status"]["reason"]


def test_other_jobs_secrets_are_hidden_in_the_process_table():
    row = dict(procs([1])[0], command="python train.py --api-key sk-abcdefghijklmnopqrstuv --lr 1")
    app = TopApp(lambda: dict(NO_GPU, processes=[row]))

    async def go():
        async with app.run_test(size=(160, 30)) as pilot:
            await pilot.pause()
            table = app.query_one("#procs")
            shown = " ".join(str(c) for c in table.get_row_at(0))
            assert "sk-abcdefghijklmnopqrstuv" not in shown
            assert "--api-key *** --lr 1" in shown
            await pilot.press("q")

    asyncio.run(go())
