"""The /metrics endpoint: job identity labels, the collector, and a scrape during a real job."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudiag.agent.base.config import Settings
from gpudiag.agent.fleet.identity import identity_from, parse_cgroup, redact_command
from gpudiag.agent.fleet.metrics import LiveJob
from gpudiag.agent.fleet.server import MetricsServer, serve_job
from gpudiag.agent.output.report import load_report
from gpudiag.agent.session.live import live_doc
from gpudiag.agent.session.session import Session, SessionOptions, SessionParts
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.base import Sample, Target
from tests.conftest import WORKLOADS, gpudiag, kill_left_job

SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    "1f2e3d4c_5b6a_7980_a1b2_c3d4e5f6a7b8.slice/cri-containerd-"
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n"
)
CGROUPFS = (
    "12:memory:/kubepods/besteffort/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f6a7b8/"
    "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[str, list]:
    """Metric family name -> samples, parsed with prometheus_client's own parser."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("text", [SYSTEMD, CGROUPFS])
def test_kubepods_cgroup_gives_pod_uid_and_container(text):
    cg = parse_cgroup(text)
    assert cg["pod_uid"] == "1f2e3d4c-5b6a-7980-a1b2-c3d4e5f6a7b8"
    assert cg["container_id"] in ("0123456789ab", "fedcba987654")


def test_outside_a_pod_the_cgroup_gives_nothing():
    assert parse_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") == {}


def test_identity_from_downward_api_and_slurm():
    env = {
        "POD_NAME": "trainer-7f9c",
        "POD_NAMESPACE": "ml",
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
    }
    ids = identity_from(
        77, ["/usr/bin/python3", "/home/a/train.py", "--lr", "0.1"], SYSTEMD, env, "alice", "n1"
    )
    assert ids["pod"] == "trainer-7f9c" and ids["namespace"] == "ml"
    assert ids["container"] == "0123456789ab" and ids["pod_uid"].startswith("1f2e3d4c")
    assert ids["slurm_job_id"] == "4242" and ids["slurm_step_id"] == "0"
    assert ids["user"] == "alice" and ids["Hostname"] == "n1" and ids["pid"] == "77"
    assert ids["command"] == "python3 train.py --lr 0.1"  # no paths


def test_outside_a_pod_hostname_is_not_a_pod_name():
    ids = identity_from(5, ["python"], "0::/user.slice\n", {"HOSTNAME": "box"}, "bob", "box")
    assert ids["pod"] == "" and ids["namespace"] == "" and ids["slurm_job_id"] == ""


def test_command_label_drops_secrets_and_stays_short():
    cmd = redact_command(
        [
            "python",
            "train.py",
            "--api-key",
            "sk-123",
            "--hf-token=hf_abc",
            "--db-password",
            "hunter2",
            "WANDB_API_KEY=xyz",
            "--data=/mnt/datasets/imagenet/train",
        ]
    )
    for secret in ("sk-123", "hf_abc", "hunter2", "xyz", "/mnt"):
        assert secret not in cmd
    assert "--api-key ***" in cmd and "--hf-token=***" in cmd
    assert "--max-tokens 512" in redact_command(["python", "t.py", "--max-tokens", "512"])
    assert len(redact_command(["python", "x" * 500])) <= 80


def _doc() -> dict:
    return {
        "run": {"duration_s": 12.0, "agent": {"cpu_cores": 0.02, "cpu_budget_cores": 0.03}},
        "findings": [
            {
                "id": "DATA001",
                "title": "Input pipeline starves the loop",
                "severity": "error",
                "impact": 0.61,
                "expected_speedup": 2.56,
                "cost": {"usd_per_hour": 1.83},
            },
            {
                "id": "MEM001",
                "title": "headroom",
                "severity": "note",
                "impact": 0.0,
                "expected_speedup": 1.0,
            },
        ],
        "breakdown": {"shares": {"data_wait": 0.61, "forward": 0.39}},
        "metrics": {"steps_per_second": 4.5},
        "critical_path": {"gpu_idle": 0.7},
        "cost": {"available": True, "idle": {"usd_per_hour": 2.1}},
        "probes": [{"name": "stacks", "available": True}, {"name": "gpu", "available": False}],
    }


def test_collector_serves_findings_gpus_and_health_with_job_labels():
    ids = identity_from(9, ["python", "t.py"], "", {"SLURM_JOB_ID": "7"}, "u", "node1")
    job = LiveJob(ids, _doc)
    job.tap(
        [
            Sample(
                "gpu",
                1,
                {"gpu": "0", "uuid": "GPU-abc", "name": "NVIDIA H100"},
                {"util_gpu": 0.3, "power_w": 210.0, "gpm_sm_active": None},
            )
        ]
    )
    server = MetricsServer("127.0.0.1", 0, lambda: [job])
    try:
        fams = scrape(server.url)
    finally:
        server.close()
    impact = {s.labels["finding"]: s for s in fams["gpudiag_finding_impact_ratio"]}
    assert impact["DATA001"].value == 0.61 and impact["DATA001"].labels["severity"] == "error"
    assert impact["DATA001"].labels["slurm_job_id"] == "7"
    assert impact["DATA001"].labels["Hostname"] == "node1"
    assert "pid" not in impact["DATA001"].labels and "command" not in impact["DATA001"].labels
    job_label = impact["DATA001"].labels["job"]
    assert job_label == "slurm/7"
    (info,) = fams["gpudiag_job_info"]
    assert info.value == 1.0
    want = {"job": job_label, "Hostname": "node1", "pid": "9", "command": "python t.py"}
    assert info.labels == want
    usd = fams["gpudiag_finding_idle_gpu_usd_per_hour"]
    assert [(s.labels["finding"], s.value) for s in usd] == [("DATA001", 1.83)]
    top = fams["gpudiag_top_finding_impact_ratio"]
    assert [s.labels["finding"] for s in top] == ["DATA001"]  # a note is never the top
    shares = {s.labels["category"]: s.value for s in fams["gpudiag_loop_share_ratio"]}
    assert shares == {"data_wait": 0.61, "forward": 0.39}
    assert fams["gpudiag_gpu_idle_ratio"][0].value == 0.7
    assert fams["gpudiag_steps_per_second"][0].value == 4.5
    util = fams["gpudiag_gpu_utilization_ratio"][0]
    assert util.value == 0.3 and util.labels["UUID"] == "GPU-abc"
    assert util.labels["modelName"] == "NVIDIA H100" and util.labels["gpu"] == "0"
    assert "gpudiag_gpu_sm_active_ratio" not in fams or not fams["gpudiag_gpu_sm_active_ratio"]
    up = {s.labels["probe"]: s.value for s in fams["gpudiag_probe_up"]}
    assert up == {"stacks": 1.0, "gpu": 0.0}
    assert fams["gpudiag_process_resident_memory_bytes"][0].value > 0
    (rss,) = fams["gpudiag_resident_memory_bytes"]
    assert rss.labels == {"Hostname": rss.labels["Hostname"]} and rss.value > 0
    assert [s.name for s in fams["gpudiag_cpu_seconds"]] == ["gpudiag_cpu_seconds_total"]


def test_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = gpudiag(
            "run", "-q", "--metrics-port", str(port), "--", sys.executable, "-c", "print(1)"
        )
    assert res.returncode == 2
    assert res.stderr.startswith("gpudiag: error: cannot serve metrics on 127.0.0.1:")
    assert "Traceback" not in res.stderr
    res = gpudiag("run", "--metrics-addr", "not-an-ip", "--metrics-port", "0", "--", "true")
    assert res.returncode == 2 and "--metrics-addr" in res.stderr


def _job(seconds: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKLOADS / "starved_loader.py"), "--seconds", seconds],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_scrape_during_a_real_job_matches_its_report():
    pytest.importorskip("torch")
    proc = _job("40")
    opts = SessionOptions(duration_s=35, rate_hz=100, window_s=1.0, cpu_budget=None, progress=False)
    server = MetricsServer("127.0.0.1", 0, lambda: [])
    report = lambda: live_doc(session, "attach", ["python", "starved_loader.py"], proc.pid)  # noqa: E731
    job: LiveJob = serve_job(server, report, proc.pid, proc.args)
    settings = Settings(Thresholds(), (), None)
    parts = SessionParts(log=lambda m: None, sink=job.tap)
    session = Session(Target(proc.pid), settings, opts, parts)
    job.refresh_s = 0.0  # every scrape analyses afresh, so it is the report it was made from
    import threading

    worker = threading.Thread(target=session.run, daemon=True)
    worker.start()
    try:
        fams: dict = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(2)
            fams = scrape(server.url)
            if any(
                s.labels["severity"] != "note" for s in fams.get("gpudiag_finding_impact_ratio", [])
            ):
                break
        doc = job.last_doc
        assert doc is not None and doc["findings"], doc
        impact = {s.labels["finding"]: s for s in fams["gpudiag_finding_impact_ratio"]}
        speedups = fams["gpudiag_finding_expected_speedup_ratio"]
        speed = {s.labels["finding"]: s.value for s in speedups}
        assert set(impact) == {f["id"] for f in doc["findings"]}
        for f in doc["findings"]:
            assert impact[f["id"]].value == pytest.approx(f["impact"])
            assert impact[f["id"]].labels["severity"] == f["severity"]
            assert speed[f["id"]] == pytest.approx(f["expected_speedup"])
        top = doc["findings"][0]["id"]
        assert top in ("DATA001", "DATA002")
        labels = impact[top].labels
        (info,) = [s.labels for s in fams["gpudiag_job_info"] if s.labels["job"] == labels["job"]]
        assert info["pid"] == str(proc.pid) and info["command"].endswith("--seconds 40")
        assert info["command"].startswith("python") and "/" not in info["command"]
        assert labels["user"] and labels["Hostname"]
        shares = {s.labels["category"]: s.value for s in fams["gpudiag_loop_share_ratio"]}
        assert shares["data_wait"] == pytest.approx(doc["breakdown"]["shares"]["data_wait"])
    finally:
        session.stop()
        worker.join(timeout=30)
        server.close()
        proc.kill()
        proc.wait()


@pytest.mark.long
def test_run_serves_metrics_while_the_job_runs(tmp_path):
    pytest.importorskip("torch")
    port, out = free_port(), tmp_path / "r.json"
    cmd = [sys.executable, "-m", "gpudiag.agent.cli.main", "run", "-q", "--metrics-port", str(port)]
    cmd += ["--cpu-budget", "0", "--window", "1", "--until-sure", "--duration", "20"]
    cmd += ["--out", str(out), "--", sys.executable, str(WORKLOADS / "starved_loader.py")]
    cmd += ["--seconds", "24"]
    # its stderr through a file: the job left running (--until-sure) keeps its copy open
    err = tmp_path / "gpudiag.stderr"
    with open(err, "w") as fe:
        gd = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fe)
    seen: set[str] = set()
    labels: dict = {}
    try:
        for _ in range(40):
            time.sleep(0.5 if not seen else 1.0)
            try:
                fams = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                continue
            for s in fams.get("gpudiag_finding_impact_ratio", []):
                seen.add(s.labels["finding"])
                labels = s.labels
            if seen - {"START001"}:
                break
        # seen: SIGTERM stops the look and writes the report (gpudiag passes it on to the
        # job, whose status, 128 + 15, it exits with); a look already sure exits 0
        gd.send_signal(signal.SIGTERM)
        code = gd.wait(timeout=90)
        assert code in (0, 128 + signal.SIGTERM), err.read_text()
    finally:
        gd.kill()
        kill_left_job(err.read_text())
    run = load_report(str(out))["run"]
    assert run["pid"] and (code == 0 or run["end_reason"] == "interrupted"), run
    assert seen & {"DATA001", "DATA002"}, seen
    assert labels["user"] == _me() and labels["job"].startswith(f"{_me()}@")


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _job_doc(hooks: dict, sps: float | None) -> dict:
    return {
        "findings": [],
        "metrics": {} if sps is None else {"steps_per_second": sps},
        "probes": [{"name": "stacks", "available": True}, hooks],
    }


def _families(doc: dict, ident: dict | None = None) -> dict:
    ids = ident or identity_from(9, ["python", "t.py"], "", {}, "u", "node1")
    job = LiveJob(ids, lambda: doc)
    server = MetricsServer("127.0.0.1", 0, lambda: [job])
    try:
        return scrape(server.url)
    finally:
        server.close()


@pytest.mark.parametrize(
    "hooks,sps",
    [
        ({"name": "hooks", "available": True}, 3.0),  # connected, steps timed
        ({"name": "hooks", "available": True, "info": True, "reason": "not connected"}, None),
        ({"name": "hooks", "available": True, "reason": "no step events"}, None),
        ({"name": "hooks", "available": False}, None),
    ],
)
def test_steps_per_second_is_there_whenever_the_hooks_read_up(hooks, sps):
    fams = _families(_job_doc(hooks, sps))
    up = {s.labels["probe"]: s.value for s in fams["gpudiag_probe_up"]}
    steps = fams.get("gpudiag_steps_per_second", [])
    assert up["stacks"] == 1.0
    assert up["hooks"] == (1.0 if sps is not None else 0.0)
    assert bool(steps) == (up["hooks"] == 1.0)


def test_series_keep_their_job_label_across_a_restart_and_counters_end_in_total():
    before = identity_from(9, ["python", "t.py"], "", {}, "u", "node1")
    after = identity_from(4321, ["python", "t.py"], "", {}, "u", "node1")
    doc = _job_doc({"name": "hooks", "available": True}, 2.0)
    a, b = _families(doc, before), _families(doc, after)
    assert a["gpudiag_steps_per_second"][0].labels == b["gpudiag_steps_per_second"][0].labels
    assert (
        a["gpudiag_job_info"][0].labels["pid"] == "9"
        and b["gpudiag_job_info"][0].labels["pid"] == "4321"
    )
    pod = identity_from(
        9,
        ["python", "t.py"],
        "",
        {"POD_NAME": "trainer-0", "POD_NAMESPACE": "ml", "KUBERNETES_SERVICE_HOST": "x"},
        "u",
        "n",
    )
    assert LiveJob(pod, lambda: doc).labels["job"] == "ml/trainer-0"
    job = LiveJob(before, lambda: doc)
    gpu = {"gpu": "0", "uuid": "GPU-a", "name": "H100"}
    job.tap([Sample("gpu", 1, gpu, {"ecc_uncorrected": 2.0})])
    server = MetricsServer("127.0.0.1", 0, lambda: [job])
    try:
        text = urllib.request.urlopen(server.url, timeout=10).read().decode()
    finally:
        server.close()
    assert "# TYPE gpudiag_gpu_ecc_uncorrected_errors_total counter" in text
    assert re.search(r"^gpudiag_gpu_ecc_uncorrected_errors_total\{.*\} 2\.0$", text, re.M)
    counters = re.findall(r"^# TYPE (\S+) counter$", text, re.M)
    assert counters and all(name.endswith("_total") for name in counters), counters


def test_category_values_are_explained_in_help():
    doc = _job_doc({"name": "hooks", "available": True}, 2.0)
    doc["breakdown"] = {"shares": {"data_wait": 0.5}}
    ids = identity_from(9, ["python", "t.py"], "", {}, "u", "node1")
    server = MetricsServer("127.0.0.1", 0, lambda: [LiveJob(ids, lambda: doc)])
    try:
        text = urllib.request.urlopen(server.url, timeout=10).read().decode()
    finally:
        server.close()
    helps = dict(
        ln[len("# HELP ") :].split(" ", 1) for ln in text.splitlines() if ln.startswith("# HELP ")
    )
    for cat in ("host", "gpu", "transfer", "distributed", "cost", "run"):
        assert f"{cat} (" in helps["gpudiag_finding_impact_ratio"], cat
    for cat in ("data_wait", "storage_io", "forward", "gil_wait", "other"):
        assert f"{cat} (" in helps["gpudiag_loop_share_ratio"], cat
