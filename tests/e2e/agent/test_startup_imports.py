"""`gpudiag mcp` (and every command's parser) starts without loading what only a diagnosis
needs: the analysis engine with every finding, jsonschema, torch, textual. A structural check
of what a fresh interpreter imported, not a timing (benchmarks/mcp_startup.py times it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "gpudiag.analyzers.engine.analysis",
    "gpudiag.analyzers.engine.registry",
    "jsonschema",
    "torch",
    "textual",
)


def loaded_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter holds after running `code`."""
    probe = (
        f"{code}\nimport sys, json\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return set(json.loads(res.stdout.splitlines()[-1]))


def test_the_command_line_and_its_parser_load_no_engine():
    code = "from gpudiag.agent.cli.main import build_parser\nbuild_parser()"
    assert loaded_after(code) == set()


def test_the_mcp_server_is_built_without_the_engine(tmp_path):
    pytest.importorskip("mcp", reason="pip install 'gpudiag[mcp]'")
    code = (
        "from pathlib import Path\n"
        "from gpudiag.agent.cli.main import build_parser\n"
        "from gpudiag.agent.commands.mcp_server import build_server\n"
        "from gpudiag.agent.commands.mcp_tools import McpConfig\n"
        "build_parser().parse_args(['mcp'])\n"
        f"build_server(McpConfig(Path({str(tmp_path)!r}), False))"
    )
    assert loaded_after(code) == set()


def test_the_engine_still_loads_when_a_report_is_analysed():
    code = "from gpudiag.analyzers import analyze\nassert callable(analyze)"
    assert loaded_after(code) >= {"gpudiag.analyzers.engine.analysis"}
