"""deploy/kubernetes: every manifest validates against Kubernetes' own JSON schemas (strict:
an unknown field fails, as kubectl's field validation does) for every Kubernetes version
kubernetes-validate bundles, offline (the package ships the schemas: CI asks no host but the
package index); the Prometheus Operator's PodMonitor, a custom resource it has no schema for,
against tests/fixtures/kubernetes/podmonitor-v1.schema.json."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions, resources_from_file

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.y*ml"))
CUSTOM = {  # (apiVersion, kind) -> the schema a custom resource is held to
    ("monitoring.coreos.com/v1", "PodMonitor"): ROOT
    / "tests"
    / "fixtures"
    / "kubernetes"
    / "podmonitor-v1.schema.json",
}
VERSIONS = sorted(set(all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))


def check(resource: dict) -> list[str]:
    """Where `resource` breaks its schema (one line per Kubernetes version or custom schema);
    empty when it is valid. A kind with no schema at all is an error, never skipped."""
    custom = CUSTOM.get((resource.get("apiVersion"), resource.get("kind")))
    if custom is not None:
        validator = jsonschema.Draft202012Validator(json.loads(custom.read_text()))
        return [f"{custom.name}: {'.'.join(map(str, e.path))}: {e.message}"
                for e in validator.iter_errors(resource)]  # fmt: skip
    errors = []
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{version}: {'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{version}: no schema: {e.message}")
    return errors


def check_file(path: Path) -> dict[str, list[str]]:
    """Every resource of a manifest file -> its errors."""
    return {
        f"{r['kind']}/{r['metadata']['name']}": check(r) for r in resources_from_file(str(path))
    }


@pytest.fixture
def offline(monkeypatch):
    """No network while validating: a schema fetched from anywhere fails the test."""

    def refuse(*args: object, **kw: object) -> None:
        raise AssertionError(f"the validation tried to reach the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def daemonset() -> dict:
    (path,) = [p for p in MANIFESTS if p.name == "daemonset.yaml"]
    return next(r for r in resources_from_file(str(path)) if r["kind"] == "DaemonSet")


def podmonitor() -> dict:
    (path,) = [p for p in MANIFESTS if p.name == "daemonset.yaml"]
    return next(r for r in resources_from_file(str(path)) if r["kind"] == "PodMonitor")


def test_every_manifest_validates_offline(offline):
    assert MANIFESTS and len(VERSIONS) >= 5 and VERSIONS[-1].startswith("1.3")
    kinds = set()
    for path in MANIFESTS:
        for name, errors in check_file(path).items():
            assert errors == [], (path.name, name, errors)
            kinds.add(name.split("/")[0])
    assert kinds >= {"DaemonSet", "PodMonitor"}


def broken_daemonsets() -> dict[str, dict]:
    """The DaemonSet broken in ways a reviewer would miss: name -> the broken resource."""
    out = {}
    d = daemonset()
    c = d["spec"]["template"]["spec"]["containers"][0]
    out["misspelled field"] = d
    c["volumeMount"] = c.pop("volumeMounts")
    d = daemonset()
    d["spec"]["template"]["spec"]["hostPID"] = "true"
    out["a string for a boolean"] = d
    d = daemonset()
    d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9401"
    out["a string for a port"] = d
    d = daemonset()
    del d["spec"]["selector"]
    out["no selector"] = d
    d = daemonset()
    d["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = (
        "SYS_PTRACE"
    )
    out["a string for a list"] = d
    return out


@pytest.mark.parametrize("how", sorted(broken_daemonsets()))
def test_a_broken_daemonset_fails(how, offline):
    errors = check(broken_daemonsets()[how])
    assert len(errors) == len(VERSIONS), errors  # every Kubernetes version refuses it


def test_a_broken_podmonitor_fails(offline):
    for field, value in (
        ("interval", "30 seconds"),
        ("port", 9401),
        ("portz", "metrics"),
        ("scheme", "grpc"),
    ):
        p = podmonitor()
        p["spec"]["podMetricsEndpoints"][0][field] = value
        assert check(p), field
    p = podmonitor()
    del p["spec"]["selector"]
    assert check(p)


def test_an_unknown_kind_is_an_error_not_a_skip(offline):
    d = daemonset()
    d["apiVersion"], d["kind"] = "apps/v1", "DeamonSet"
    assert all("no schema" in e for e in check(d)) and check(d)


def test_a_broken_manifest_file_fails(tmp_path, offline):
    text = (ROOT / "deploy" / "kubernetes" / "daemonset.yaml").read_text()
    assert "runAsUser: 0" in text
    bad = tmp_path / "daemonset.yaml"
    bad.write_text(text.replace("runAsUser: 0", "runAsUser: root"))
    errors = check_file(bad)
    assert errors["DaemonSet/gpudiag"] and not errors["PodMonitor/gpudiag"]
    assert "runAsUser" in errors["DaemonSet/gpudiag"][0]
