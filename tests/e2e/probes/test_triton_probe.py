"""End to end: the Triton probe: Triton's metrics text parsed (a real 2.51 scrape), its endpoint
read from the server's command line, and a real HTTP server named `tritonserver` on 127.0.0.1
(tests/workloads/fake_tritonserver.py) found among the job's processes and scraped into per-model
intervals."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpudiag.probes.base import Target
from gpudiag.probes.servers.triton import MAX_MODELS, TritonProbe, metrics_url

WORKLOADS = Path(__file__).parents[2] / "workloads"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake(tmp_path: Path, *args: str) -> subprocess.Popen:
    """The fake server as a process named tritonserver, a child of this test."""
    exe = tmp_path / "tritonserver"
    exe.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(WORKLOADS)!r})\n"
        "from fake_tritonserver import main\nmain()\n"
    )
    exe.chmod(0o755)
    return subprocess.Popen([str(exe), *args])


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the fake tritonserver never listened")


def _scrape(probe: TritonProbe, seconds: float) -> list:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out += probe.sample()
        time.sleep(probe.interval_s)
    return out


def test_a_server_among_the_jobs_processes_is_found_and_scraped(tmp_path: Path) -> None:
    port = _free_port()
    proc = _fake(tmp_path, "--metrics-port", str(port), "--rate", "200", "--idle-first", "1")
    try:
        _wait_listening(port)
        probe = TritonProbe()
        assert probe.open(Target(os.getpid())).available
        assert probe.applies()
        assert probe.endpoint is not None and probe.endpoint.pid == proc.pid
        samples = _scrape(probe, 4.0)
    finally:
        proc.kill()
        proc.wait()
    intervals = [s for s in samples if "interval_s" in s.values]
    assert intervals and all(s.labels == {"model": "classifier", "version": "1"} for s in samples)
    assert all(0.3 < (s.values["interval_s"] or 0) < 1.5 for s in intervals)
    served = sum(s.values["requests"] or 0 for s in intervals)
    assert 250 < served < 800  # about 3 s of 200/s, less the last interval held back
    steady = [s for s in intervals if "steady_requests" in s.values]
    assert steady, "intervals inside the traffic are marked"
    rate = sum(s.values["steady_requests"] or 0 for s in steady) / sum(
        s.values["steady_s"] or 0 for s in steady
    )
    assert rate == pytest.approx(200, rel=0.15)
    assert any((s.values.get("pending") or 0) == 3 for s in samples)
    assert probe.problems() == []
    # the server gone: the failed scrapes are told, a few only
    for _ in range(8):
        probe.sample()
    assert 1 <= len(probe.problems()) <= 5
    probe.close()


def test_a_server_with_metrics_off_is_said_so(tmp_path: Path) -> None:
    port = _free_port()
    proc = _fake(tmp_path, "--metrics-port", str(port), "--allow-metrics", "false")
    try:
        _wait_listening(port)
        probe = TritonProbe()
        probe.open(Target(os.getpid()))
    finally:
        proc.kill()
        proc.wait()
    st = probe.final_status()
    assert probe.applies() and st is not None and not st.available
    assert "--allow-metrics" in (st.reason or "") and "allow_metrics=True" in (st.hint or "")


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path


def _fake_server_with_stub(tmp_path: Path) -> Path:
    """A `tritonserver` (Python, asleep) whose child `triton_python_backend_stub` is busy."""
    stub = _script(
        tmp_path / "triton_python_backend_stub",
        "import time\nend = time.time() + 30\nwhile time.time() < end:\n    sum(range(1000))\n",
    )
    return _script(
        tmp_path / "tritonserver",
        f"import subprocess, time\np = subprocess.Popen([{str(stub)!r}])\ntime.sleep(30)\n",
    )


def test_the_stacks_of_a_tritonserver_are_its_python_backends(tmp_path: Path) -> None:
    """`gpudiag run -- tritonserver ...`: the server is C++, its Python models run in a
    `triton_python_backend_stub` child; py-spy reads that one."""
    from gpudiag.probes.servers.triton import model_process
    from gpudiag.probes.stacks.probe import StackConfig, StackProbe

    server = _fake_server_with_stub(tmp_path)
    proc = subprocess.Popen([str(server)])
    try:
        deadline = time.monotonic() + 10
        while model_process(proc.pid) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        child = model_process(proc.pid)
        assert child is not None and child != proc.pid
        assert model_process(os.getpid()) is None  # not a tritonserver
        probe = StackProbe(StackConfig(rate_hz=20, window_s=1.0))
        st = probe.open(Target(proc.pid))
        try:
            assert st.available, st.reason
            assert probe.loop_pid == child
        finally:
            probe.close()
    finally:
        for p in psutil.Process(proc.pid).children(recursive=True):
            p.kill()
        proc.kill()
        proc.wait()


def test_attach_to_a_tritonserver_profiles_its_python_backend(tmp_path: Path) -> None:
    from gpudiag.agent.session.targets import choose_target
    from gpudiag.probes.servers.triton import model_process

    server = _fake_server_with_stub(tmp_path)
    shell = subprocess.Popen(["sh", "-c", f"{server} & wait"])  # its parent: not Python
    try:
        deadline = time.monotonic() + 10
        srv = None
        while time.monotonic() < deadline:
            kids = psutil.Process(shell.pid).children()
            srv = kids[0].pid if kids else None
            if srv is not None and model_process(srv) is not None:
                break
            time.sleep(0.1)
        assert srv is not None
        time.sleep(0.5)  # the stub busy, its server asleep
        choice = choose_target(srv)
        assert choice.pid == model_process(srv) and choice.root == srv
        assert "runs its Python models in pid" in choice.why
    finally:
        for p in psutil.Process(shell.pid).children(recursive=True):
            p.kill()
        shell.kill()
        shell.wait()


# ---- round 6 (issue 53): what the server's command line names is its owner's word --------
def test_only_an_ip_address_and_a_port_number_are_taken_from_the_command_line() -> None:
    """V03: `--metrics-port '19604/internal/admin?token=x&q='` made root GET that path."""
    with pytest.raises(ValueError, match="not a port number"):
        metrics_url(["x", "--metrics-port", "19604/internal/admin?token=x&q="])
    for port in ("0", "65536", "99999999999", "８００２", "-1"):
        with pytest.raises(ValueError):
            metrics_url(["x", "--metrics-port", port])
    with pytest.raises(ValueError, match="not an IP address"):
        metrics_url(["x", "--metrics-address", "evil.example/x?"])
    assert metrics_url(["x", "--metrics-address", "::1"]) == "http://[::1]:8002/metrics"


def _listener(port: int, got: list[bytes]) -> socket.socket:
    """Another process's service on `port` (here: a thread of this test), recording what it
    is sent."""
    import threading

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(1)
                try:
                    got.append(conn.recv(4096))
                    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nsecret_admin_value 1\n")
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_a_port_the_server_does_not_listen_on_is_never_scraped(tmp_path: Path) -> None:
    """V03: the server's owner named another service's port; root's gpudiag fetched it."""
    port = _free_port()
    got: list[bytes] = []
    srv = _listener(port, got)
    exe = tmp_path / "tritonserver"  # a "server" that listens on nothing, naming that port
    exe.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    exe.chmod(0o755)
    proc = subprocess.Popen([str(exe), "--metrics-port", str(port)])
    try:
        deadline = time.monotonic() + 10
        probe = TritonProbe()
        while probe.endpoint is None and time.monotonic() < deadline:
            probe = TritonProbe()
            probe.open(Target(os.getpid()))
            time.sleep(0.1)
        assert probe.endpoint is not None
        assert _scrape(probe, 1.0) == []
    finally:
        proc.kill()
        proc.wait()
        srv.close()
    assert got == [], "nothing is sent to a port the server does not hold"
    assert any("does not listen on" in p for p in probe.problems())
    st = probe.final_status()
    assert st is not None and not st.available


def test_models_past_the_budget_are_not_followed(tmp_path: Path) -> None:
    """V02: 40,000 new model names a scrape grew root's watch by 30 MB/s."""

    port = _free_port()
    proc = _fake(tmp_path, "--metrics-port", str(port), "--new-models", str(3 * MAX_MODELS))
    try:
        _wait_listening(port)
        probe = TritonProbe(interval_s=0.2)
        probe.open(Target(os.getpid()))
        samples = _scrape(probe, 2.0)
    finally:
        proc.kill()
        proc.wait()
    models = {s.labels["model"] for s in samples}
    assert probe._scrapes >= 3
    assert len(probe._prev) <= MAX_MODELS and len(probe._held) <= MAX_MODELS
    assert "classifier" in models and len(models) <= MAX_MODELS
    assert any(f"over {MAX_MODELS} models" in p for p in probe.problems())
