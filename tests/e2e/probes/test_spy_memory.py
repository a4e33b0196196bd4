"""A py-spy recorder's memory is its own: wait4's ru_maxrss of a child the agent forked holds
the agent's peak across the exec, so an agent of 242 MB with two recorders reported 761 MB."""

from __future__ import annotations

import subprocess

import psutil

from gpudiag.probes.stacks.pyspy import SpyRun, own_peak_rss, wait_recorder, watch_memory


def test_a_recorders_peak_memory_is_its_own_not_the_agents():
    ballast = bytearray(96 << 20)  # the agent, grown by what it imported and read
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1
    agent = psutil.Process().memory_info().rss
    run = SpyRun("all", 0, 1, "")
    run.proc = subprocess.Popen(["sleep", "0.6"], stderr=subprocess.PIPE, text=True)
    watch_memory([run], poll_s=0.05)
    wait_recorder(run)
    assert run.proc.returncode == 0 and run.cpu_s >= 0.0
    assert 0 < run.maxrss_bytes < min(32 << 20, agent // 4)
    del ballast


def test_a_gone_process_reads_no_memory(tmp_path):
    assert own_peak_rss(1 << 30) == 0
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_text("Name:\tpy-spy\nVmHWM:\t  10240 kB\n")
    assert own_peak_rss(7, str(tmp_path)) == 10 << 20
