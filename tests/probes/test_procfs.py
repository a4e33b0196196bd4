"""Host and process probes read the real /proc: contract tests (samples match fields)."""

from __future__ import annotations

import os
import time

from gpudiag.probes.base import Target
from gpudiag.probes.host.probe import HostProbe, parse_psi
from gpudiag.probes.host.process import (
    ProcessProbe,
    parse_cpu_max,
    parse_stat_line,
)


def test_parse_psi():
    text = (
        "some avg10=1.00 avg60=0.50 avg300=0.10 total=12345\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=678\n"
    )
    assert parse_psi(text) == {"some": 12345, "full": 678}


def test_parse_stat_line_with_odd_command_names():
    assert parse_stat_line("12 (my (weird) name) S 1 2 3") == ("my (weird) name", "S")


def _check_contract(probe, samples):
    declared = {f.name for f in probe.fields}
    assert samples
    for s in samples:
        assert s.probe == probe.name
        assert set(s.values) <= declared, set(s.values) - declared
        for v in s.values.values():
            assert v is None or isinstance(v, float)


def test_host_probe_contract():
    probe = HostProbe()
    assert probe.open(Target(os.getpid())).available
    time.sleep(0.2)
    samples = probe.sample()
    _check_contract(probe, samples)
    main = [s for s in samples if not s.labels][0]
    assert 0.0 <= main.values["cpu_util"] <= 1.0
    assert main.values["cpu_count"] >= 1


def test_process_probe_reports_missing_pid():
    status = ProcessProbe().open(Target(2**22 + 12345))
    assert not status.available and "no process" in status.reason


def test_cpu_max_parsing():
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("150000 100000\n") == 1.5
    assert parse_cpu_max("garbage") is None


def test_host_probes_of_one_gpudiag_share_their_scan_of_the_box(monkeypatch):
    """watch runs a host probe per job, and each read every process's CPU every 5 s (eight
    jobs beside 77 processes: eight scans of the box each time): a scan younger than half
    the interval is shared."""
    from gpudiag.probes.host import probe as host

    clock = [10**12]
    scans = []
    real = host.psutil.process_iter

    def counted(*a, **k):
        scans.append(clock[0])
        return real(*a, **k)

    monkeypatch.setattr(host, "now_ns", lambda: clock[0])
    monkeypatch.setattr(host.psutil, "process_iter", counted)
    monkeypatch.setattr(host, "BOX_SCAN", host.BoxScan())
    probes = [HostProbe(others_interval_s=2.0) for _ in range(3)]
    for p in probes:
        assert p.open(Target(os.getpid())).available
    assert len(scans) == 1
    clock[0] += int(2.1e9)
    got = [p.sample() for p in probes]
    assert len(scans) == 2
    for samples in got:  # each still gets the other processes' CPU since its last look
        assert any(s.labels.get("scope") == "others" for s in samples)


def test_host_probes_of_one_gpudiag_share_their_read_of_the_boxs_cpu_and_memory(monkeypatch):
    """Each of watch's host probes read /proc/stat, /proc/meminfo and /proc/vmstat every tick
    (8 jobs: 8 reads a second of the same box-wide figures, 0.010 cores of a 0.10 budget
    beside the hostile processes): a read younger than half the tick is shared."""
    from gpudiag.probes.host import probe as host

    clock = [10**12]
    reads = []
    real = host.psutil.cpu_times

    def counted(*a, **k):
        reads.append(clock[0])
        return real(*a, **k)

    monkeypatch.setattr(host, "now_ns", lambda: clock[0])
    monkeypatch.setattr(host.psutil, "cpu_times", counted)
    monkeypatch.setattr(host, "HOST_READ", host.HostRead(), raising=False)
    probes = [HostProbe(interval_s=1.0, others_interval_s=60.0) for _ in range(3)]
    for p in probes:
        assert p.open(Target(os.getpid())).available
    reads.clear()
    for _ in range(3):
        for p in probes:
            p.sample()
        clock[0] += int(1.0e9)
    assert len(reads) == 3, reads  # one a tick, not one a probe
    for p in probes:  # each still gives the box's figures
        assert any("mem_total_bytes" in s.values for s in p.sample())
