"""A real `gpudiag mcp` session on a planted job, as docs/assistants.md shows it: starts
tests/workloads/starved_loader.py (DATA001 planted), then drives `gpudiag mcp` over stdio with
the MCP SDK's client (list_jobs, diagnose, explain) and prints each call and its structured
result, shortened, as Markdown.

    python scripts/mcp_transcript.py > /tmp/transcript.md
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent


def short(value: object, depth: int = 0) -> object:
    """A result shortened for the page: long lists cut to 3, long strings to 240."""
    if isinstance(value, dict):
        return {k: short(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        cut = [short(v, depth + 1) for v in value[:3]]
        return cut + ([f"... {len(value) - 3} more"] if len(value) > 3 else [])
    if isinstance(value, str) and len(value) > 240:
        return value[:240] + "..."
    return value


def block(title: str, args: dict, result: object) -> str:
    return (
        f"**{title}** `{json.dumps(args)}`\n\n```json\n"
        + json.dumps(short(result), indent=1)
        + "\n```\n"
    )


async def session(pid: int, reports: str) -> list[str]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gpudiag.agent.cli.main", "mcp", "--reports", reports],
    )
    out = []
    progress: list[str] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async with Client(params) as client:
        jobs = (await client.call_tool("list_jobs", {})).structured_content or {}
        jobs["jobs"] = [j for j in jobs.get("jobs", []) if j["pid"] == pid]
        out.append(block("list_jobs", {}, jobs))
        args = {"pid": pid, "seconds": 60, "until_sure": True}
        t0 = time.monotonic()
        res = await client.call_tool("diagnose", args, progress_callback=on_progress)
        took = time.monotonic() - t0
        out.append(f"progress notifications: {len(progress)}, the first: `{progress[0]}`\n")
        out.append(block(f"diagnose ({took:.0f} s)", args, res.structured_content))
        top = (res.structured_content or {})["verdict"]["finding"]
        exp = await client.call_tool("explain", {"finding": top})
        out.append(block("explain", {"finding": top}, exp.structured_content))
    return out


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        job = subprocess.Popen(
            [sys.executable, str(ROOT / "tests/workloads/starved_loader.py"), "--seconds", "120"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**__import__("os").environ, "GPUDIAG_TEST_READY": str(ready)},
        )
        try:
            while not ready.exists():
                time.sleep(0.2)
            time.sleep(1)
            parts = anyio.run(session, job.pid, str(Path(tmp) / "reports"))
        finally:
            job.kill()
            job.wait()
    sys.stdout.write("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
