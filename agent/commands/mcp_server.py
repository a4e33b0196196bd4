"""`gpudiag mcp`'s server on the official MCP Python SDK (`pip install 'gpudiag[mcp]'`): the
tools of `mcp_tools` with typed inputs and structured outputs, the catalogue and the saved
reports as resources, a prompt that chains them; over stdio, or streamable HTTP on a
loopback address with a bearer token."""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import BaseModel, Field

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands import mcp_tools as tools
from gpudiag.agent.output.report import tool_version

INSTRUCTIONS = (
    "gpudiag tells why a PyTorch GPU job is slow. list_jobs shows the jobs you may profile; "
    "diagnose attaches to one by pid and returns its verdict, time breakdown and ranked "
    "findings with the fix and the expected speed-up; explain gives a finding's "
    "documentation; compare holds two saved reports against each other as the CI gate does."
)


class Job(BaseModel):
    pid: int
    user: str
    command: str
    gpus: str
    cpu_percent: float
    rss_bytes: int
    python: bool


class Gpu(BaseModel):
    index: str
    name: str
    util_gpu: float | None
    mem_used_bytes: float | None
    mem_total_bytes: float | None


class Jobs(BaseModel):
    jobs: list[Job]
    gpus: list[Gpu]
    hidden_other_users: int = Field(description="processes of other users, not listed")
    truncated: bool


class Evidence(BaseModel):
    metric: str
    value: float | None
    unit: str | None
    threshold: float | None
    comparison: str | None
    setting: str | None
    source: str


class Fix(BaseModel):
    summary: str
    actions: list[str]


class FindingOut(BaseModel):
    id: str
    title: str
    severity: str
    confidence: float | None
    impact: float | None = Field(description="share of wall time it costs")
    expected_speedup: float | None = Field(description="the rate after the fix, x times")
    speedup_kind: str | None
    message: str
    fix: Fix
    evidence: list[Evidence]
    location: str | None
    usd_per_hour: float | None


class Verdict(BaseModel):
    finding: str | None
    sure: bool
    confidence: float | None
    statement: str


class RunOut(BaseModel):
    mode: str | None
    pid: int | None
    command: list[str]
    duration_s: float | None


class Diagnosis(BaseModel):
    report: str = Field(description="the saved report's path")
    verdict: Verdict
    workload: str
    breakdown: dict[str, float] = Field(description="share of wall time per category")
    findings: list[FindingOut]
    findings_total: int
    run: RunOut


class InReport(BaseModel):
    report: str
    finding: FindingOut | None


class Explanation(BaseModel):
    id: str
    title: str
    category: str
    documentation: str = Field(description="Markdown, as docs/findings.md has it")
    thresholds: dict[str, float] = Field(description="the thresholds its unit reads")
    in_report: InReport | None


class Compared(BaseModel):
    baseline: str
    current: str
    verdict: str = Field(description="pass, warn, fail or inconclusive")
    note: str | None
    comparisons: list[dict[str, Any]]


class Tried(BaseModel):
    report: str
    trials_report: str | None
    exit_code: int
    trials: list[dict[str, Any]]
    output_tail: list[str]


def _checked(fn: Any, *args: Any) -> Any:
    """A tool's work; its UsageError becomes the tool's one error line."""
    try:
        return fn(*args)
    except UsageError as exc:
        raise ToolError(str(exc)) from None


def build_server(cfg: tools.McpConfig) -> MCPServer:
    """The MCP server over `cfg` (nothing is held between calls but the reports written)."""
    server = MCPServer(
        "gpudiag", version=tool_version(), instructions=INSTRUCTIONS, log_level="WARNING"
    )
    _tools(server, cfg)
    _resources(server, cfg)
    _prompts(server)
    return server


def _tools(server: MCPServer, cfg: tools.McpConfig) -> None:
    @server.tool()
    async def list_jobs() -> Jobs:
        """The GPU and Python processes on this box you may profile (as `gpudiag top` sees
        them), and the box's GPUs."""
        return Jobs.model_validate(await anyio.to_thread.run_sync(_checked, tools.list_jobs))

    @server.tool()
    async def diagnose(
        pid: int, ctx: Context, seconds: float = 30.0, until_sure: bool = True, hooks: bool = False
    ) -> Diagnosis:
        """Attach to a running job by pid (as `gpudiag attach` does) for `seconds` or until
        the verdict is sure; returns the verdict, the time breakdown, the findings (id,
        impact, speed-up, fix, evidence) and the saved report's path. `hooks` loads the
        in-process hooks into the job (exact steps/s; needs ptrace permission)."""
        req = tools.DiagnoseRequest(pid, seconds, until_sure, hooks)
        _checked(tools.check_request, req)
        return Diagnosis.model_validate(await _with_progress(ctx, req, cfg))

    @server.tool()
    def explain(finding: str, report: str | None = None) -> Explanation:
        """A finding id's documentation (what it means, the fix, how impact and speed-up are
        measured) and the thresholds it reads; with `report` (a saved report's name), that
        report's finding and threshold values."""
        return Explanation.model_validate(_checked(tools.explain, cfg, finding, report))

    @server.tool()
    def compare(baseline: str, current: str) -> Compared:
        """Two saved reports (names in the reports folder) compared as `gpudiag gate`
        compares them: noise-aware regressions of the gated metrics and a verdict."""
        return Compared.model_validate(_checked(tools.compare, cfg, baseline, current))

    @server.tool()
    async def try_fix(
        report: str, ctx: Context, finding: str | None = None, rounds: int = 3, seconds: float = 10
    ) -> Tried:
        """Only when the server runs with --allow-try: measure the fixes a saved report's
        findings carry (`gpudiag try --from REPORT`) on the command that report recorded,
        streaming its rounds as progress. No other command can be run."""
        req = tools.TryRequest(report, finding, rounds, seconds)
        _checked(tools.try_command, cfg, req)

        def progress(done: float, total: float | None, message: str) -> None:
            anyio.from_thread.run(ctx.report_progress, done, total, message)

        out = await anyio.to_thread.run_sync(_checked, tools.try_fix, cfg, req, progress)
        return Tried.model_validate(out)


async def _with_progress(ctx: Context, req: tools.DiagnoseRequest, cfg: tools.McpConfig) -> dict:
    """diagnose() in a worker thread, with a progress notification every second."""
    result: dict = {}
    failed: list[ToolError] = []

    async def work() -> None:
        try:
            result.update(await anyio.to_thread.run_sync(_checked, tools.diagnose, cfg, req))
        except ToolError as exc:  # the tool's one error, not a task group's
            failed.append(exc)
        finally:
            tg.cancel_scope.cancel()

    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(work)
        while True:
            done = min(time.monotonic() - start, req.seconds)
            msg = f"profiling pid {req.pid}: {done:.0f} of at most {req.seconds:g} s"
            await ctx.report_progress(done, req.seconds, msg)
            await anyio.sleep(1.0)
    if failed:
        raise failed[0]
    return result


def _resources(server: MCPServer, cfg: tools.McpConfig) -> None:
    @server.resource("gpudiag://catalogue", mime_type="application/json")
    def catalogue() -> str:
        """Every finding id gpudiag can report: id, title, category."""
        return json.dumps(tools.catalogue(), indent=1)

    @server.resource("gpudiag://catalogue/{finding}", mime_type="text/markdown")
    def finding_doc(finding: str) -> str:
        """One finding's generated documentation."""
        try:
            return tools.explain(cfg, finding)["documentation"]
        except UsageError as exc:
            raise ResourceError(str(exc)) from None

    @server.resource("gpudiag://reports", mime_type="application/json")
    def reports() -> str:
        """The saved reports in the reports folder, newest first."""
        return json.dumps(tools.saved_reports(cfg), indent=1)

    @server.resource("gpudiag://reports/{name}", mime_type="application/json")
    def report(name: str) -> str:
        """A saved report's summary (verdict, breakdown, findings)."""
        try:
            doc, path = tools.read_report(cfg, name)
        except UsageError as exc:
            raise ResourceError(str(exc)) from None
        return json.dumps(tools.summary(doc, path), indent=1)


def _prompts(server: MCPServer) -> None:
    @server.prompt(name="diagnose_slow_job", title="Diagnose a slow job")
    def diagnose_slow_job(pid: str = "") -> str:
        """Find out why a PyTorch GPU job is slow and what to change."""
        which = f"the job with pid {pid}" if pid else "the job the user means (call list_jobs)"
        return (
            f"My PyTorch job is slow. Diagnose {which} with gpudiag: call diagnose on it "
            "(until_sure), then explain the verdict's finding. Tell me where the time goes "
            "(the breakdown), the top findings with their evidence, the fix with its values "
            "and the expected speed-up, and say how sure the verdict is. If a saved report "
            "of an earlier run exists, compare the two."
        )


class BearerAuth:
    """An ASGI wrapper that refuses every HTTP request without `Authorization: Bearer
    <token>` (401), compared in constant time."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = b'{"error": "a bearer token is needed (Authorization: Bearer ...)"}'
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def http_app(server: MCPServer, token: str, host: str) -> BearerAuth:
    """The streamable HTTP app at /mcp behind the bearer token."""
    return BearerAuth(server.streamable_http_app(host=host), token)


def serve_http(server: MCPServer, host: str, port: int, token: str) -> None:
    """Serve streamable HTTP on host:port until interrupted."""
    import uvicorn

    app = http_app(server, token, host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    uvicorn.Server(config).run()
