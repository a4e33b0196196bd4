"""`gpudiag mcp`: the MCP server driven by the SDK's own client, in-process for every tool and
error, once over real stdio in a subprocess and once over streamable HTTP with its token; a
diagnose call on a planted training job returns the planted cause."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed: pip install 'gpudiag[mcp]'")

import anyio  # noqa: E402  # after the skip: the SDK brings it
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from gpudiag.agent.base.config import load_settings  # noqa: E402
from gpudiag.agent.commands import mcp_tools  # noqa: E402
from gpudiag.agent.commands.gate import decide, fingerprint, load_gate_config  # noqa: E402
from gpudiag.agent.commands.mcp_server import build_server  # noqa: E402
from gpudiag.agent.commands.mcp_tools import McpConfig  # noqa: E402
from gpudiag.agent.commands.replay import replay_report  # noqa: E402
from gpudiag.agent.output.report import load_report, write_report  # noqa: E402
from gpudiag.analyzers.engine.catalogue_doc import finding_doc, owners  # noqa: E402
from gpudiag.analyzers.model.catalogue import CATALOGUE  # noqa: E402
from tests.conftest import WORKLOADS, start_training  # noqa: E402
from tests.e2e.agent.test_e2e_workloads import check  # noqa: E402

H100 = Path(__file__).resolve().parents[2] / "fixtures" / "h100"


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    """A reports folder with two recorded H100 runs: a starved loader and the same job fixed."""
    folder = tmp_path_factory.mktemp("reports")
    for name in ("starved", "starved_fixed"):
        doc = replay_report(str(H100 / f"{name}.jsonl.gz"), load_settings(None))
        write_report(doc, folder / f"{name}.json")
    (folder / "notes.json").write_text('{"not": "a report"}')
    return folder


def call(cfg: McpConfig, tool: str, args: dict, progress: list | None = None):
    """One tool call through the SDK's client, in-process."""

    async def go():
        async with Client(build_server(cfg)) as client:

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                if progress is not None:
                    progress.append((done, total, message))

            return await client.call_tool(tool, args, progress_callback=on_progress)

    return anyio.run(go)


def error_of(result) -> str:
    assert result.is_error, result.structured_content
    return result.content[0].text


def test_the_tools_have_typed_inputs_and_structured_outputs(reports):
    async def go():
        async with Client(build_server(McpConfig(reports))) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in anyio.run(go)}
    assert set(tools) == {"list_jobs", "diagnose", "explain", "compare", "try_fix"}
    for t in tools.values():
        assert t.output_schema and t.output_schema["type"] == "object", t.name
    assert tools["diagnose"].input_schema["properties"]["pid"]["type"] == "integer"
    assert tools["diagnose"].input_schema["required"] == ["pid"]


def test_explain_gives_the_generated_documentation_and_thresholds(reports):
    res = call(McpConfig(reports), "explain", {"finding": "data001"})
    out = res.structured_content
    assert out["id"] == "DATA001"
    assert out["documentation"] == finding_doc(CATALOGUE["DATA001"], owners()["DATA001"])
    assert out["thresholds"]["data_wait_error"] == pytest.approx(0.4)
    assert out["in_report"] is None


def test_explain_with_a_report_gives_its_finding_and_evidence(reports):
    out = call(
        McpConfig(reports), "explain", {"finding": "DATA001", "report": "starved.json"}
    ).structured_content
    found = out["in_report"]["finding"]
    assert found["id"] == "DATA001" and found["expected_speedup"] > 2
    assert "num_workers=" in found["fix"]["summary"]
    assert any(e["setting"] == "data_wait_warn" for e in found["evidence"])


def test_compare_decides_as_the_gate_does(reports):
    out = call(
        McpConfig(reports), "compare", {"baseline": "starved.json", "current": "starved_fixed.json"}
    ).structured_content
    base = json.loads((reports / "starved.json").read_text())
    cur = json.loads((reports / "starved_fixed.json").read_text())
    from gpudiag.agent.commands.gate import run_metrics

    verdict, comps, _ = decide(
        load_gate_config(None),
        [run_metrics(base)],
        fingerprint(base["environment"]),
        [run_metrics(cur)],
        fingerprint(cur["environment"]),
    )
    assert out["verdict"] == verdict
    assert out["comparisons"] == [c.to_dict() for c in comps]
    steps = next(c for c in out["comparisons"] if c["metric"] == "steps_per_second")
    assert steps["current"] > 5 * steps["baseline"]


@pytest.mark.parametrize(
    "tool,args,says",
    [
        ("explain", {"finding": "NOPE001"}, "no finding 'NOPE001' in the catalogue"),
        ("explain", {"finding": "DATA001", "report": "../x.json"}, "not in the reports folder"),
        ("explain", {"finding": "DATA001", "report": "/etc/passwd"}, "not in the reports folder"),
        ("compare", {"baseline": "missing.json", "current": "starved.json"}, "no report"),
        ("compare", {"baseline": "notes.json", "current": "starved.json"}, "notes.json"),
        ("diagnose", {"pid": 0}, "PID must be positive"),
        ("diagnose", {"pid": 2**22 + 7}, "no process with pid"),
        ("diagnose", {"pid": 1, "seconds": 0.5}, "seconds must be from 1 to 600"),
        ("try_fix", {"report": "starved.json"}, "start the server with `gpudiag mcp --allow-try`"),
    ],
)
def test_one_clear_error_per_bad_input(reports, tool, args, says):
    text = error_of(call(McpConfig(reports), tool, args))
    assert says in text and "\n" not in text and "Traceback" not in text


def test_diagnose_refuses_gpudiag_itself(reports):
    assert "cannot attach to gpudiag itself" in error_of(
        call(McpConfig(reports), "diagnose", {"pid": os.getpid()})
    )


def test_diagnose_refuses_another_users_process(reports, monkeypatch):
    monkeypatch.setattr(mcp_tools, "may_profile", lambda pid: f"pid {pid} belongs to user 'bob'")
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        text = error_of(call(McpConfig(reports), "diagnose", {"pid": job.pid}))
    finally:
        job.kill()
        job.wait()
    assert text.endswith(f"cannot attach: pid {job.pid} belongs to user 'bob'")


def test_an_error_while_attached_is_the_tools_one_line(reports, monkeypatch):
    from gpudiag.agent.base.errors import UsageError

    def fails(cfg, req):
        raise UsageError("cannot attach: py-spy could not read the job")

    monkeypatch.setattr(mcp_tools, "diagnose", fails)
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        text = error_of(call(McpConfig(reports), "diagnose", {"pid": job.pid}))
    finally:
        job.kill()
        job.wait()
    assert text.endswith("cannot attach: py-spy could not read the job") and "\n" not in text


def test_try_fix_runs_only_a_command_a_run_recorded(reports):
    # the fixtures were replayed: no launched command of theirs can be rerun
    text = error_of(call(McpConfig(reports, allow_try=True), "try_fix", {"report": "starved.json"}))
    assert "records no launched command (mode 'replay')" in text


def test_try_fix_builds_try_from_the_reports_own_command(reports, tmp_path):
    doc = json.loads((reports / "starved.json").read_text())
    doc["run"]["mode"] = "run"
    write_report(doc, tmp_path / "ran.json")
    argv, path, out = mcp_tools.try_command(
        McpConfig(tmp_path, allow_try=True), mcp_tools.TryRequest("ran.json", "data001", 2, 5)
    )
    assert argv[argv.index("--") + 1 :] == doc["run"]["command"]
    assert argv[3:7] == ["try", "--from", str(path), "--finding"] and "DATA001" in argv
    assert out.parent == tmp_path


def test_list_jobs_shows_only_what_the_caller_may_profile(monkeypatch):
    snap = {
        "processes": [
            {"pid": 11, "user": "me", "command": "python train.py --api-key sk-abc123def456ghi789"},
            {"pid": 12, "user": "bob", "command": "python theirs.py", "gpus": "0:3.1GiB"},
        ],
        "gpus": [{"index": "0", "name": "H100", "util_gpu": 35.0}],
    }
    monkeypatch.setattr(mcp_tools, "may_profile", lambda pid: None if pid == 11 else "not yours")
    out = mcp_tools.list_jobs(lambda: snap)
    assert [j["pid"] for j in out["jobs"]] == [11] and out["hidden_other_users"] == 1
    assert "sk-abc" not in out["jobs"][0]["command"] and "***" in out["jobs"][0]["command"]
    assert out["gpus"][0]["util_gpu"] == 35.0


def test_list_jobs_over_the_protocol_sees_a_job_of_ours(reports):
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        out = call(McpConfig(reports), "list_jobs", {}).structured_content
    finally:
        job.kill()
        job.wait()
    assert job.pid in [j["pid"] for j in out["jobs"]]
    assert os.getpid() not in [j["pid"] for j in out["jobs"]]  # gpudiag itself is not a job


def test_resources_and_prompt(reports):
    async def go():
        async with Client(build_server(McpConfig(reports))) as client:
            listed = [str(r.uri) for r in (await client.list_resources()).resources]
            cat = json.loads((await client.read_resource("gpudiag://catalogue")).contents[0].text)
            doc = (await client.read_resource("gpudiag://catalogue/GPU003")).contents[0].text
            saved = json.loads((await client.read_resource("gpudiag://reports")).contents[0].text)
            one = (await client.read_resource("gpudiag://reports/starved.json")).contents[0].text
            prompt = await client.get_prompt("diagnose_slow_job", {"pid": "4242"})
            return listed, cat, doc, saved, json.loads(one), prompt

    listed, cat, doc, saved, one, prompt = anyio.run(go)
    assert listed == ["gpudiag://catalogue", "gpudiag://reports"]
    assert {c["id"] for c in cat} == set(CATALOGUE)
    assert doc.startswith("### GPU003:")
    assert {"starved.json", "starved_fixed.json"} <= {r["name"] for r in saved}
    assert one["verdict"]["finding"] == "DATA001" and one["verdict"]["sure"]
    text = prompt.messages[0].content.text
    assert "pid 4242" in text and "diagnose" in text and "explain" in text


def test_mcp_over_real_stdio(reports):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gpudiag.agent.cli.main", "mcp", "--reports", str(reports)],
    )

    async def go():
        async with Client(params) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            res = await client.call_tool("explain", {"finding": "CKPT001"})
            return names, res

    names, res = anyio.run(go)
    assert "diagnose" in names and res.structured_content["id"] == "CKPT001"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mcp_over_http_needs_its_token(reports, tmp_path):
    import httpx
    from mcp.client.streamable_http import streamable_http_client

    port, token = free_port(), "t0k3n-for-the-test"
    env = {**os.environ, "GPUDIAG_MCP_TOKEN": token}
    argv = ["-m", "gpudiag.agent.cli.main", "mcp", "--reports", str(reports)]
    server = subprocess.Popen(
        [sys.executable, *argv, "--http", f"127.0.0.1:{port}"],
        env=env,
        stderr=open(tmp_path / "err", "w"),
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                refused = httpx.post(url, json={}, timeout=5)
                break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert refused.status_code == 401
        wrong = httpx.post(url, json={}, headers={"Authorization": "Bearer nope"}, timeout=5)
        assert wrong.status_code == 401
        import httpx2

        async def go():
            auth = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
            async with auth, Client(streamable_http_client(url, http_client=auth)) as client:
                return await client.call_tool("explain", {"finding": "SYNC001"})

        assert anyio.run(go).structured_content["id"] == "SYNC001"
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "bearer token" not in (tmp_path / "err").read_text()  # given: not shown


def test_usage_errors_of_the_command(cli, tmp_path, monkeypatch):
    res = cli("mcp", "--http", "localhost:80x")
    assert res.returncode == 2 and "--http takes ADDR:PORT" in res.stderr
    (tmp_path / "f").write_text("")
    res = cli("mcp", "--reports", str(tmp_path / "f"))
    assert res.returncode == 2 and "not a folder" in res.stderr
    monkeypatch.setitem(sys.modules, "gpudiag.agent.commands.mcp_server", None)
    res = cli("mcp", "--reports", str(tmp_path))
    assert res.returncode == 2 and "pip install 'gpudiag[mcp]'" in res.stderr


@pytest.mark.long
def test_diagnose_a_planted_job_returns_its_cause(tmp_path, busy_core):
    job = start_training(
        [str(WORKLOADS / "starved_loader.py"), "--seconds", "75"], tmp_path / "ready"
    )
    progress: list = []
    try:
        res = call(
            McpConfig(tmp_path / "reports"),
            "diagnose",
            {"pid": job.pid, "seconds": 60, "until_sure": True},
            progress,
        )
        assert job.poll() is None  # the job was not disturbed
    finally:
        job.kill()
        job.wait()
    assert not res.is_error, res.content
    out = res.structured_content
    check(load_report(out["report"]), "DATA001")  # as test_attach_mode holds attach's report
    # the tool's findings are the report's, in its order (HOST002: the busy_core beside it)
    ours = [f for f in out["findings"] if f["severity"] != "note" and f["id"] != "HOST002"]
    assert ours[0]["id"] == "DATA001" and ours[0]["fix"]["actions"] and ours[0]["evidence"]
    assert out["verdict"]["statement"]
    assert Path(out["report"]).parent == (tmp_path / "reports").resolve()
    assert Path(out["report"]).is_file() and out["run"]["pid"] == job.pid
    assert progress and progress[0][1] == 60 and "profiling pid" in progress[0][2]


@pytest.mark.slow
def test_try_fix_measures_a_run_reports_fix_and_streams_its_rounds(tmp_path):
    """`gpudiag run` diagnoses the planted starved loader; try_fix, allowed, tries the fix
    its report carries on the command it recorded, its lines streamed as progress."""
    from tests.conftest import gpudiag_until_sure

    reports = tmp_path / "reports"
    reports.mkdir()
    job = [sys.executable, str(WORKLOADS / "starved_loader.py"), "--seconds", "40"]
    res = gpudiag_until_sure(
        "run", "-q", "--until-sure", "--duration", "30", "--out", str(reports / "run.json"),
        "--", *job, tmp=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    progress: list = []
    args = {"report": "run.json", "finding": "DATA001", "rounds": 1, "seconds": 3}
    out = call(McpConfig(reports, allow_try=True), "try_fix", args, progress)
    assert not out.is_error, out.content
    tried = out.structured_content
    assert tried["trials"] and tried["trials"][0]["finding"] == "DATA001", tried
    assert tried["trials_report"] and Path(tried["trials_report"]).parent == reports
    assert progress and all(p[2] for p in progress)  # its lines, as they came
