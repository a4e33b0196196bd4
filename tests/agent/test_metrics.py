"""The /metrics endpoint: job identity labels, the collector, and a scrape during a real job."""

from __future__ import annotations

import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudiag.agent.fleet.identity import identity_from, parse_cgroup, redact_command
from gpudiag.agent.fleet.metrics import LiveJob
from gpudiag.agent.fleet.server import MetricsServer
from gpudiag.probes.base import Sample

SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    "1f2e3d4c_5b6a_7980_a1b2_c3d4e5f6a7b8.slice/cri-containerd-"
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n"
)

CGROUPFS = (
    "12:memory:/kubepods/besteffort/pod1f2e3d4c-5b6a-7980-a1b2-c3d4e5f6a7b8/"
    "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210\n"
)


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


def test_a_settled_job_gives_its_report_and_is_not_analysed_again():
    """Once the report is written (Wiring.finish settles the job), every read gives it: the
    last export carries the report's numbers and the ended session is not analysed again."""
    now = [0.0]
    calls: list[float] = []

    def report() -> dict:
        calls.append(now[0])
        return {"live": len(calls)}

    job = LiveJob({"pid": "9", "command": "t"}, report, refresh_s=5.0, clock=lambda: now[0])
    assert job.doc() == {"live": 1} and job.doc() == {"live": 1}  # within refresh_s
    now[0] = 6.0
    assert job.doc() == {"live": 2}
    job.settle({"final": True})
    now[0] = 60.0
    assert job.doc() == {"final": True} and job.last_doc == {"final": True}
    assert calls == [0.0, 6.0]
