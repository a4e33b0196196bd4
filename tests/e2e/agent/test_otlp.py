"""`--otlp`: the metrics endpoint's families and each job's verdict exported over OTLP/HTTP,
received by a real OTLP/HTTP receiver the test starts on 127.0.0.1 (it decodes the protobuf
posts as a collector does), and over OTLP/gRPC (`--otlp-protocol grpc`) to a real gRPC server
on 127.0.0.1 that serves OpenTelemetry's collector services (opentelemetry-proto's stubs)."""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip(
    "opentelemetry.sdk",
    reason="the OpenTelemetry SDK is not installed: pip install 'gpudiag[otlp]'",
)
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="pip install 'gpudiag[otlp]'")

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (  # noqa: E402
    ExportLogsServiceRequest,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
)

from gpudiag.agent.base.config import load_settings  # noqa: E402
from gpudiag.agent.base.errors import UsageError  # noqa: E402
from gpudiag.agent.commands.replay import replay_report  # noqa: E402
from gpudiag.agent.fleet.metrics import LiveJob  # noqa: E402
from gpudiag.agent.fleet.otlp import (  # noqa: E402
    Otlp,
    choose_protocol,
    export_interval_ms,
    grpc_target,
    metrics_url,
    unit_of,
)
from gpudiag.agent.fleet.server import MetricsServer  # noqa: E402

H100 = Path(__file__).resolve().parents[2] / "fixtures" / "h100"


class Receiver:
    """An OTLP/HTTP receiver on 127.0.0.1: records every decoded metrics and logs post."""

    def __init__(self) -> None:
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  # http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/metrics":
                    outer.metrics.append(ExportMetricsServiceRequest.FromString(body))
                elif self.path == "/v1/logs":
                    outer.logs.append(ExportLogsServiceRequest.FromString(body))
                self.send_response(200 if self.path in ("/v1/metrics", "/v1/logs") else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver:
    """An OTLP/gRPC receiver on 127.0.0.1: OpenTelemetry's MetricsService and LogsService
    (opentelemetry-proto's generated stubs) on a real grpc.server; records every request."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as lpb
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as lgrpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc

        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        self.peers: list[str] = []
        outer = self

        class Metrics(mgrpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802  # the service's name
                outer.metrics.append(request)
                outer.peers.append(context.peer())
                return mpb.ExportMetricsServiceResponse()

        class Logs(lgrpc.LogsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                outer.logs.append(request)
                outer.peers.append(context.peer())
                return lpb.ExportLogsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        mgrpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        lgrpc.add_LogsServiceServicer_to_server(Logs(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.stop(grace=None).wait(5)


@pytest.fixture
def grpc_receiver():
    pytest.importorskip(
        "opentelemetry.exporter.otlp.proto.grpc", reason="pip install 'gpudiag[otlp-grpc]'"
    )
    r = GrpcReceiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def receiver():
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    """Two recorded H100 jobs' reports: a starved loader and the same job fixed."""
    return {
        n: replay_report(str(H100 / f"{n}.jsonl.gz"), load_settings(None))
        for n in ("starved", "starved_fixed")
    }


def live(name: str, doc: dict) -> LiveJob:
    ident = {"pid": str(doc["run"]["pid"]), "command": name, "user": "u", "Hostname": "box"}
    return LiveJob(ident, lambda: doc)


def points(receiver: Receiver) -> dict[str, list]:
    """metric name -> (unit, attributes dict, value) of every data point received."""
    out: dict[str, list] = {}
    for req in receiver.metrics:
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    data = m.gauge if m.HasField("gauge") else m.sum
                    for p in data.data_points:
                        attrs = {a.key: a.value.string_value for a in p.attributes}
                        out.setdefault(m.name, []).append((m.unit, attrs, p.as_double))
    return out


def resource_of(receiver: Receiver) -> dict:
    rm = receiver.metrics[0].resource_metrics[0]
    return {
        a.key: (a.value.string_value or a.value.int_value or list(a.value.array_value.values))
        for a in rm.resource.attributes
    }


def assert_exported(receiver, doc: dict, job: LiveJob) -> None:
    """The findings, units and resource a receiver got for `job`, and its verdict record."""
    got = points(receiver)
    impact = {a["finding"]: (u, v) for u, a, v in got["gpudiag_finding_impact_ratio"]}
    assert impact["DATA001"] == ("1", pytest.approx(doc["findings"][0]["impact"]))
    speed = got["gpudiag_finding_expected_speedup_ratio"]
    assert any(a["finding"] == "DATA001" and v > 2 for _, a, v in speed)
    shares = {a["category"]: v for _, a, v in got["gpudiag_loop_share_ratio"]}
    assert shares["data_wait"] == pytest.approx(0.89977)
    (unit, attrs, sps) = got["gpudiag_steps_per_second"][0]
    assert unit == "{step}/s" and sps == pytest.approx(doc["metrics"]["steps_per_second"])
    assert attrs["job"] == job.labels["job"]
    usd = got["gpudiag_finding_idle_gpu_usd_per_hour"]
    assert usd and all(u == "{USD}/h" for u, _, _ in usd)
    res = resource_of(receiver)
    assert res["service.name"] == "gpudiag" and res["host.name"]
    assert res["k8s.pod.name"] == "trainer-0" and res["k8s.namespace.name"] == "ml"
    assert isinstance(res["process.pid"], int)
    (record,) = records(receiver)
    assert record.body.string_value == doc["verdict"]["statement"]
    attrs = {a.key: a.value for a in record.attributes}
    assert attrs["gpudiag.verdict.finding"].string_value == "DATA001"
    assert attrs["gpudiag.verdict.sure"].bool_value is True
    assert record.severity_text == "WARN"
    # the log records carry the same resource as the metrics
    rl = receiver.logs[0].resource_logs[0]
    assert {a.key for a in rl.resource.attributes} == set(res)


def records(receiver) -> list:
    """Every log record received."""
    return [
        r
        for req in receiver.logs
        for rl in req.resource_logs
        for s in rl.scope_logs
        for r in s.log_records
    ]


def export_one(receiver, doc: dict, target: Otlp, monkeypatch) -> LiveJob:
    """One job's metrics and verdict exported to `target` as run/attach do, then closed."""
    monkeypatch.setenv("POD_NAME", "trainer-0")
    monkeypatch.setenv("POD_NAMESPACE", "ml")
    job = live("train", doc)
    server = MetricsServer("127.0.0.1", None, lambda: [job], otlp=target)
    assert server.port is None and "OTLP" in server.url  # no listener without --metrics-port
    server.finished(doc, job.labels)
    server.close()
    return job


def test_otlp_exports_the_findings_units_and_resource(receiver, docs, monkeypatch):
    job = export_one(receiver, docs["starved"], Otlp(receiver.url), monkeypatch)
    assert_exported(receiver, docs["starved"], job)


def test_otlp_grpc_exports_the_findings_units_and_resource(grpc_receiver, docs, monkeypatch):
    target = Otlp(grpc_receiver.url, "grpc")
    job = export_one(grpc_receiver, docs["starved"], target, monkeypatch)
    assert_exported(grpc_receiver, docs["starved"], job)
    assert grpc_receiver.peers and all("127.0.0.1" in p for p in grpc_receiver.peers)


def test_the_last_export_carries_the_settled_report(receiver, docs):
    """run and attach settle the job with its report before closing: the export at close
    carries the report's numbers (not a live analysis of the ended session)."""
    calls: list[int] = []

    def live_report() -> dict:
        calls.append(1)
        return docs["starved"]

    job = LiveJob({"pid": "9", "command": "train", "user": "u"}, live_report)
    server = MetricsServer("127.0.0.1", None, lambda: [job], otlp=Otlp(receiver.url))
    final = docs["starved_fixed"]
    job.settle(final)
    server.finished(final, job.labels)
    server.close()
    (_, attrs, sps) = points(receiver)["gpudiag_steps_per_second"][-1]
    assert attrs["job"] == job.labels["job"]
    assert sps == pytest.approx(final["metrics"]["steps_per_second"]) and not calls


def test_the_export_interval_is_opentelemetrys(monkeypatch, cli):
    """Every OpenTelemetry SDK's OTEL_METRIC_EXPORT_INTERVAL (ms), else the SDK's 60 s; a bad
    value is one line before anything starts."""
    monkeypatch.delenv("OTEL_METRIC_EXPORT_INTERVAL", raising=False)
    assert export_interval_ms() is None  # the SDK's default
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", " 15000 ")
    assert export_interval_ms() == 15000.0
    for bad in ("abc", "0", "-5", "inf", "nan"):
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", bad)
        with pytest.raises(UsageError, match="OTEL_METRIC_EXPORT_INTERVAL must be a positive"):
            export_interval_ms()
    res = cli("attach", "1", "--otlp", "http://127.0.0.1:4318")
    assert res.returncode == 2 and "OTEL_METRIC_EXPORT_INTERVAL must be" in res.stderr


def test_exports_come_at_the_interval_the_environment_sets(receiver, docs, monkeypatch):
    """OTEL_METRIC_EXPORT_INTERVAL=200: the SDK's reader exports on its own before close."""
    import time

    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    job = live("train", docs["starved"])
    server = MetricsServer("127.0.0.1", None, lambda: [job], otlp=Otlp(receiver.url))
    try:
        deadline = time.monotonic() + 8  # well under the SDK's default (and the old 10 s)
        while len(receiver.metrics) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(receiver.metrics) >= 2  # two periodic exports, before any close
    finally:
        server.close()
    assert "gpudiag_steps_per_second" in points(receiver)


def test_otlp_exports_one_series_per_job(receiver, docs):
    """watch's case: every job the collector lists gets its own series (its `job` label)."""
    jobs = [live("a", docs["starved"]), live("b", docs["starved_fixed"])]
    server = MetricsServer("127.0.0.1", None, lambda: jobs, otlp=Otlp(receiver.url))
    server.close()
    sps = {a["job"]: v for _, a, v in points(receiver)["gpudiag_steps_per_second"]}
    assert len(sps) == 2 and set(sps) == {j.labels["job"] for j in jobs}
    assert sps[jobs[1].labels["job"]] > 5 * sps[jobs[0].labels["job"]]


def test_units_and_bad_endpoints():
    assert unit_of("gpudiag_gpu_fb_used_bytes") == "By"
    assert unit_of("gpudiag_gpu_pcie_tx_bytes_per_second") == "By/s"
    assert unit_of("gpudiag_cpu_seconds_total") == "s"
    assert metrics_url("http://127.0.0.1:4318/") == (
        "http://127.0.0.1:4318/v1/metrics",
        "http://127.0.0.1:4318/v1/logs",
    )
    for bad in ("127.0.0.1:4318", "grpc://x:4317", "http://"):
        with pytest.raises(UsageError, match="--otlp takes an OTLP/HTTP URL"):
            metrics_url(bad)


def test_the_protocol_is_chosen_as_opentelemetry_names_it(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    assert choose_protocol(None, None) == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert choose_protocol(None, None) == "grpc"  # every OpenTelemetry SDK's variable
    assert choose_protocol(None, "http/protobuf") == "http/protobuf"  # the config over it
    assert choose_protocol("grpc", "http/protobuf") == "grpc"  # the flag over both
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(UsageError, match="OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/pro"):
        choose_protocol(None, None)


def test_grpc_endpoints():
    assert grpc_target("http://127.0.0.1:4317/") == ("http://127.0.0.1:4317", True)
    assert grpc_target("https://otel.example:4317") == ("https://otel.example:4317", False)
    for bad in ("127.0.0.1:4317", "grpc://x:4317", "http://", "http://x:4318/v1/metrics"):
        with pytest.raises(UsageError, match="--otlp-protocol grpc takes http://HOST:PORT"):
            grpc_target(bad)


def test_grpc_without_its_extra_is_one_line(monkeypatch):
    from gpudiag.agent.fleet.otlp import NEEDS_GRPC, exporters

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.metric_exporter", None)
    with pytest.raises(UsageError) as err:
        exporters("http://127.0.0.1:4317", "grpc")
    assert str(err.value) == NEEDS_GRPC and "pip install 'gpudiag[otlp-grpc]'" in NEEDS_GRPC


def test_grpc_usage_errors(cli, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    res = cli("attach", "1", "--otlp-protocol", "grpc", "--otlp", "localhost:4317")
    assert res.returncode == 2 and "--otlp-protocol grpc takes http://HOST:PORT" in res.stderr
    res = cli("attach", "1", "--otlp-protocol", "http/json", "--otlp", "http://x:4318")
    assert res.returncode == 2 and "--otlp-protocol" in res.stderr and "grpc" in res.stderr
    res = cli("attach", "1", "--otlp", "grpc://127.0.0.1:4317")
    assert res.returncode == 2 and "--otlp-protocol grpc --otlp http://HOST:4317" in res.stderr


def test_otlp_from_the_config(tmp_path):
    (tmp_path / "g.toml").write_text('[otlp]\nendpoint = "http://127.0.0.1:4318"\n')
    assert load_settings(str(tmp_path / "g.toml")).otlp_endpoint == "http://127.0.0.1:4318"
    (tmp_path / "grpc.toml").write_text('[otlp]\nendpoint = "http://h:4317"\nprotocol = "grpc"\n')
    assert load_settings(str(tmp_path / "grpc.toml")).otlp_protocol == "grpc"
    (tmp_path / "proto.toml").write_text('[otlp]\nprotocol = "http/json"\n')
    with pytest.raises(UsageError, match=r'\[otlp\] protocol must be "grpc" or "http/protobuf"'):
        load_settings(str(tmp_path / "proto.toml"))
    (tmp_path / "bad.toml").write_text("[otlp]\nendpoint = 4318\n")
    with pytest.raises(UsageError, match="must be a URL string"):
        load_settings(str(tmp_path / "bad.toml"))


def test_run_otlp_usage_error(cli):
    res = cli("attach", "1", "--otlp", "localhost:4318")
    assert res.returncode == 2 and "--otlp takes an OTLP/HTTP URL" in res.stderr


def test_run_otlp_sends_the_verdict_of_a_real_run(receiver, tmp_path):
    from tests.conftest import gpudiag

    out = tmp_path / "r.json"
    job = "import time\nt = time.time()\nwhile time.time() - t < 4: sum(range(10000))"
    res = gpudiag("run", "-q", "--otlp", receiver.url, "--out", str(out), "--", "python", "-c", job)
    assert res.returncode == 0, res.stderr
    records = [
        r
        for req in receiver.logs
        for rl in req.resource_logs
        for s in rl.scope_logs
        for r in s.log_records
    ]
    import json

    doc = json.loads(out.read_text())
    assert [r.body.string_value for r in records] == [doc["verdict"]["statement"]]
    got = points(receiver)
    assert got["gpudiag_job_profiled_seconds"] and "gpudiag_cpu_seconds_total" in got


def test_run_otlp_grpc_from_the_environment(grpc_receiver, tmp_path):
    """`run --otlp URL` with OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the verdict and the metrics
    reach the gRPC receiver (the CLI's path: option, environment, exporter)."""
    import json
    import os

    from tests.conftest import gpudiag

    out = tmp_path / "r.json"
    job = "import time\nt = time.time()\nwhile time.time() - t < 4: sum(range(10000))"
    env = os.environ | {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    res = gpudiag(
        "run", "-q", "--otlp", grpc_receiver.url, "--out", str(out), "--", "python", "-c", job,
        env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert [r.body.string_value for r in records(grpc_receiver)] == [doc["verdict"]["statement"]]
    got = points(grpc_receiver)
    assert got["gpudiag_job_profiled_seconds"] and "gpudiag_cpu_seconds_total" in got
    assert resource_of(grpc_receiver)["service.name"] == "gpudiag"


def test_the_collector_example_receives_otlp_on_loopback():
    import yaml

    root = Path(__file__).resolve().parents[3]
    cfg = yaml.safe_load((root / "deploy" / "otel" / "collector.yaml").read_text())
    assert cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "127.0.0.1:4318"
    pipes = cfg["service"]["pipelines"]
    assert "otlp" in pipes["metrics"]["receivers"] and "otlp" in pipes["logs"]["receivers"]
    used = {
        x for p in pipes.values() for k in ("receivers", "processors", "exporters") for x in p[k]
    }
    assert used <= set(cfg["receivers"]) | set(cfg["processors"]) | set(cfg["exporters"])


def test_attach_otlp_ends_with_the_reports_own_numbers(receiver, tmp_path):
    """`attach --otlp`: the export at the end carries the job's series from the report itself
    (its profiled seconds are the report's), and the verdict record follows."""
    import json
    import subprocess

    from tests.conftest import gpudiag

    loop = "import time\nt = time.time()\nwhile time.time() - t < 60: sum(range(10000))"
    job = subprocess.Popen([sys.executable, "-c", loop])
    try:
        out = tmp_path / "a.json"
        res = gpudiag(
            "attach", str(job.pid), "-q", "--duration", "3", "--otlp", receiver.url,
            "--out", str(out),
        )  # fmt: skip
    finally:
        job.kill()
        job.wait()
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    (_, attrs, seconds) = points(receiver)["gpudiag_job_profiled_seconds"][-1]
    assert attrs["job"] and seconds == pytest.approx(doc["run"]["duration_s"])
    assert [r.body.string_value for r in records(receiver)] == [doc["verdict"]["statement"]]
