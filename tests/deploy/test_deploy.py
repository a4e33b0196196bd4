"""deploy/: the alert rules, the Grafana dashboard, the DaemonSet and the systemd unit are
valid, and every query in them uses metrics gpudiag exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpudiag.agent.commands.watch import Watcher
from gpudiag.agent.fleet.identity import identity_from
from gpudiag.agent.fleet.metrics import GPU_FIELDS, GpudiagCollector, LiveJob
from gpudiag.analyzers.model.thresholds import Thresholds
from gpudiag.probes.base import Sample
from tests.agent.test_metrics import _doc

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

RULES = DEPLOY / "prometheus" / "gpudiag-alerts.yaml"

DASHBOARD = DEPLOY / "grafana" / "gpudiag-dashboard.json"

# dcgm-exporter's fields the dashboard joins with (not gpudiag's)
DCGM = {"DCGM_FI_DEV_GPU_UTIL"}

PROMQL_WORDS = {
    "sum", "max", "min", "avg", "by", "on", "group_left", "rate", "count", "topk",
    "without", "ignoring", "and", "or", "unless",
}  # fmt: skip


def exported() -> set[str]:
    """Every sample name gpudiag's endpoint can serve (a job with every field set)."""
    from gpudiag.agent.base.config import Settings
    from gpudiag.agent.session.session import SessionOptions

    job = LiveJob(identity_from(1, ["python"], "", {}, "u", "h"), _doc)
    job.tap(
        [
            Sample(
                "gpu",
                1,
                {"gpu": "0", "uuid": "GPU-1", "name": "H100"},
                dict.fromkeys(GPU_FIELDS, 1.0),
            )
        ]
    )
    watcher = Watcher(Settings(Thresholds(), (), None), SessionOptions(), discover=lambda: [])
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpudiagCollector(lambda: [job], watcher.health))
    ProcessCollector(namespace="gpudiag", registry=reg)
    text = generate_latest(reg).decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    return names | {f.name for f in text_string_to_metric_families(text)}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (identifiers before `{`, `(`, `[` or an operator)."""
    expr = re.sub(r"\{[^}]*\}", "{}", expr)  # label matchers
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors: [5m]
    expr = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {w for w in words - PROMQL_WORDS if not re.fullmatch(r"\d+[smhd]?|e", w)}


def test_rules_parse_and_use_exported_metrics():
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {"GpudiagJobGpuIdle"}
    names = exported()
    for r in rules:
        assert r["for"] and r["labels"]["severity"] and r["annotations"]["summary"]
        used = metric_names(r["expr"])
        assert used and used <= names, (r["alert"], used - names)
    idle = next(r for r in rules if r["alert"] == "GpudiagJobGpuIdle")
    assert "> 0.5" in idle["expr"] and idle["for"] == "30m"
    assert "gpudiag_top_finding_impact_ratio" in idle["annotations"]["top_finding"]


def test_dashboard_structure_and_queries_use_exported_metrics():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "Hostname", "job"} <= variables
    names = exported() | DCGM
    ids, exprs = set(), []
    for p in dash["panels"]:
        assert p["id"] not in ids and p["title"] and p["type"] in ("stat", "table", "timeseries")
        ids.add(p["id"])
        assert (
            set(p["gridPos"]) == {"x", "y", "w", "h"}
            and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        )
        assert p["targets"], p["title"]
        for t in p["targets"]:
            used = metric_names(t["expr"])
            assert used and used <= names, (p["title"], used - names)
            refs = set(re.findall(r"\$(\w+)", t["expr"]))
            assert refs <= variables, (p["title"], refs)
            exprs.append(t["expr"])
    for v in dash["templating"]["list"][1:]:
        assert metric_names(v["definition"].split("(", 1)[1].rsplit(",", 1)[0]) <= names
    # the join with dcgm-exporter uses its label names
    assert any("DCGM_FI_DEV_GPU_UTIL" in e and "on (UUID)" in e for e in exprs)


def test_daemonset_has_the_privileges_it_needs_and_no_more():
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and "hostNetwork" not in spec
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"]["add"] == ["SYS_PTRACE"] and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["privileged"] is False
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])  # it takes no GPU from the jobs
    env = {e["name"]: e for e in c["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["args"][0] == "watch" and c["ports"][0]["containerPort"] == 9401
    text = (DEPLOY / "kubernetes" / "daemonset.yaml").read_text()
    for why in ("hostPID", "SYS_PTRACE", "NVIDIA"):
        assert re.search(rf"^# - .*{why}", text, re.M), why  # each privilege says why


def test_daemonset_arguments_are_accepted_by_gpudiag():
    from gpudiag.agent.cli.parser import build_parser

    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "daemonset.yaml").read_text()))
    (c,) = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"][
        "containers"
    ]
    args = build_parser().parse_args(c["args"])
    assert args.metrics_addr == "0.0.0.0" and args.metrics_port == 9401
    docker = (DEPLOY / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (.*)$", docker, re.M).group(1))
    assert build_parser().parse_args(entry[1:]).command == "watch"
