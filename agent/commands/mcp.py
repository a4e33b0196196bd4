"""`gpudiag mcp`: a Model Context Protocol server, so an AI assistant can list the jobs the
user may profile, diagnose one, explain a finding, compare two reports and (with
--allow-try) measure a report's fixes. Over stdio by default; `--http ADDR:PORT` serves the
streamable HTTP transport (loopback unless another address is named) behind a bearer token.
Needs the optional extra: `pip install 'gpudiag[mcp]'`."""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from gpudiag.agent.base.errors import UsageError
from gpudiag.agent.commands.options import FromArgs
from gpudiag.text.sink import say

TOKEN_ENV = "GPUDIAG_MCP_TOKEN"
NEEDS = "gpudiag mcp needs the MCP SDK: pip install 'gpudiag[mcp]'"


@dataclass(frozen=True)
class McpOptions(FromArgs):
    """`gpudiag mcp`'s options."""

    reports: str = "."
    allow_try: bool = False
    http: str | None = None  # ADDR:PORT or PORT


def parse_http(text: str) -> tuple[str, int]:
    """--http's ADDR:PORT (or PORT, on 127.0.0.1); UsageError for anything else."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]") if sep else "127.0.0.1"
    try:
        port = int(port_text)
        ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"--http takes ADDR:PORT with a numeric address, got {text!r}") from None
    if not 0 < port < 65536:
        raise UsageError(f"--http port must be from 1 to 65535, got {port}")
    return host, port


def main(opts: McpOptions) -> int:
    """Serve MCP until the client closes stdin (or Ctrl-C on --http)."""
    from gpudiag.agent.commands.mcp_tools import McpConfig

    reports = Path(opts.reports)
    if reports.exists() and not reports.is_dir():
        raise UsageError(f"--reports {opts.reports}: not a folder")
    addr = parse_http(opts.http) if opts.http else None
    try:
        from gpudiag.agent.commands.mcp_server import build_server, serve_http
    except ImportError:
        raise UsageError(NEEDS) from None
    server = build_server(McpConfig(reports.resolve(), opts.allow_try))
    if addr is None:
        server.run("stdio")
        return 0
    host, port = addr
    if not ipaddress.ip_address(host).is_loopback:
        say(f"serving MCP on {host}, a non-loopback address: other machines can reach it")
    token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)
    if TOKEN_ENV not in os.environ:
        say(f"bearer token (set {TOKEN_ENV} to choose one): {token}")
    say(f"MCP (streamable HTTP) on http://{host}:{port}/mcp; Ctrl-C stops")
    serve_http(server, host, port, token)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `mcp` subcommand."""
    p = sub.add_parser(
        "mcp",
        help="serve gpudiag to AI assistants (Model Context Protocol)",
        description="A Model Context Protocol server over stdio: tools list_jobs, diagnose, "
        "explain, compare and try_fix (with --allow-try); the catalogue and saved reports as "
        "resources. Needs pip install 'gpudiag[mcp]'.",
    )
    p.add_argument(
        "--reports",
        default=".",
        metavar="DIR",
        help="where diagnose writes its reports and the only folder a tool reads reports "
        "from (default: the current folder)",
    )
    p.add_argument(
        "--allow-try",
        action="store_true",
        help="let try_fix run `gpudiag try` on the command a saved report recorded",
    )
    p.add_argument(
        "--http",
        metavar="ADDR:PORT",
        help="serve streamable HTTP instead of stdio (e.g. 127.0.0.1:8765), behind a bearer "
        f"token (${TOKEN_ENV}, else one made and shown on stderr)",
    )
