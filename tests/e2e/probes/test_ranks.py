"""End to end: rank discovery from process environments: below a launcher, and siblings of one
rank."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from gpudiag.probes.dist.ranks import find_ranks, sibling_ranks

# a launcher: starts N "ranks" (Python processes with a rank environment), each with a
# child that inherits its RANK (a DataLoader worker), then waits
LAUNCHER = r"""
import os, subprocess, sys, time
nap = "import time; time.sleep(60)"
worker = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {nap!r}]); {nap}"
kids = []
for r in range(int(sys.argv[1])):
    env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=sys.argv[1],
               TORCHELASTIC_RUN_ID="job42", CUDA_VISIBLE_DEVICES="4,5")
    kids.append(subprocess.Popen([sys.executable, "-c", worker], env=env))
print("started", flush=True)
time.sleep(60)
"""


@pytest.fixture
def launcher():
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER, "2"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # each rank and its worker started
        if len(psutil.Process(p.pid).children(recursive=True)) >= 4:
            break
        time.sleep(0.05)
    yield p
    for kid in psutil.Process(p.pid).children(recursive=True):
        kid.kill()
    p.kill()
    p.wait()


def test_ranks_below_a_launcher_one_per_rank_not_their_workers(launcher):
    ranks = find_ranks(launcher.pid)
    assert [r.rank for r in ranks] == [0, 1]
    kids = {k.pid for k in psutil.Process(launcher.pid).children()}
    assert {r.pid for r in ranks} == kids  # the ranks' own children are not ranks
    assert [r.gpu for r in ranks] == ["4", "5"] and ranks[0].world_size == 2


def test_attach_to_one_rank_finds_the_others(launcher):
    ranks = find_ranks(launcher.pid)
    again = sibling_ranks(ranks[1].pid)
    assert [r.pid for r in again] == [r.pid for r in ranks]
    assert sibling_ranks(launcher.pid) == ranks
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert sibling_ranks(lone.pid) == []  # not a rank, no ranks below it
    finally:
        lone.kill()
        lone.wait()


def test_a_launcher_running_one_plain_process_is_not_waited_for_long():
    from gpudiag.agent.session.ranks.launch import wait_for_ranks

    p = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
         "'import time; time.sleep(30)'])"]
    )  # fmt: skip
    try:
        t0 = time.monotonic()
        assert wait_for_ranks(p.pid, lambda: p.poll() is None, timeout_s=25, plain_s=1) == []
        assert time.monotonic() - t0 < 20
    finally:
        for kid in psutil.Process(p.pid).children(recursive=True):
            kid.kill()
        p.kill()
        p.wait()
