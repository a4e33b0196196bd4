"""How long `gpudiag mcp` takes to start: a client's `initialize` and `tools/list` answered over
stdio, from the spawn, against two floors timed the same way in the same rounds (interleaved,
the order rotating each round): the bare interpreter (`python -c pass`: spawn, no reply) and
the MCP SDK's own server (an MCPServer with one tool on stdio: what any server on the SDK
pays). Per arm: the median wall time to the tools/list reply and the child's CPU (wait4's
rusage, which a busy box inflates less than wall time); then gpudiag's share above the SDK's
floor and the gpudiag / SDK ratio. `--imports` prints where `gpudiag mcp`'s import time goes
(python -X importtime, self time summed by package).

    python benchmarks/mcp_startup.py --rounds 7
    python benchmarks/mcp_startup.py --imports
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SDK_SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("floor")
@server.tool()
def ping(x: int) -> int:
    return x
server.run("stdio")
"""


def arms(reports: str) -> dict[str, list[str]]:
    """The three commands, by name."""
    py = sys.executable
    return {
        "python -c pass": [py, "-c", "pass"],
        "SDK floor (MCPServer, 1 tool)": [py, "-c", SDK_SERVER],
        "gpudiag mcp": [py, "-m", "gpudiag.agent.cli.main", "mcp", "--reports", reports],
    }


def rpc(proc: subprocess.Popen, msg: dict) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()


def reply(proc: subprocess.Popen, want_id: int) -> dict:
    """The response with `want_id` (notifications and logs skipped)."""
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the server closed stdout before answering {want_id}")
        msg = json.loads(line)
        if msg.get("id") == want_id:
            return msg


def start_once(cmd: list[str]) -> tuple[float, float]:
    """(seconds from the spawn to the tools/list reply, the child's CPU seconds)."""
    from mcp.types import LATEST_PROTOCOL_VERSION

    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    if cmd[-1] != "pass":
        init = {
            "protocolVersion": LATEST_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        }
        rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        reply(proc, 1)
        rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
        tools = reply(proc, 2)["result"]["tools"]
        assert tools, "no tools listed"
    wall = time.perf_counter() - t0
    assert proc.stdin is not None
    proc.stdin.close()  # the stdio transport ends at EOF
    _, status, usage = os.wait4(proc.pid, 0)
    if cmd[-1] == "pass":
        wall = time.perf_counter() - t0  # no reply to wait for: its exit
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime


def imports(reports: str) -> None:
    """`gpudiag mcp`'s import self time by package (the SDK's, pydantic's, gpudiag's...)."""
    cmd = [sys.executable, "-X", "importtime", "-m", "gpudiag.agent.cli.main", "mcp"]
    proc = subprocess.run([*cmd, "--reports", reports], input=b"", capture_output=True, timeout=120)
    total: collections.Counter[str] = collections.Counter()
    for line in proc.stderr.decode().splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if m:
            parts = m.group(2).split(".")
            total[".".join(parts[:3]) if parts[0] == "gpudiag" else parts[0]] += int(m.group(1))
    own = sum(v for k, v in total.items() if k.startswith("gpudiag"))
    print(f"import self time {sum(total.values()) / 1e6:.2f} s, gpudiag's own {own / 1e6:.2f} s")
    for name, us in total.most_common(25):
        print(f"{us / 1e3:8.1f} ms  {name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--imports", action="store_true", help="the import-time breakdown only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as reports:
        if args.imports:
            imports(reports)
            return 0
        named = arms(reports)
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in named}
        order = list(named)
        for r in range(args.rounds):
            for name in order[r % 3 :] + order[: r % 3]:
                got[name].append(start_once(named[name]))
    print(f"load average {open('/proc/loadavg').read().split()[:3]}, {args.rounds} rounds")
    med = {}
    for name, runs in got.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        med[name] = (wall, cpu)
        print(f"{name:32} wall {wall:6.3f} s   cpu {cpu:6.3f} s")
    sdk, ours = med["SDK floor (MCPServer, 1 tool)"], med["gpudiag mcp"]
    print(
        f"gpudiag above the SDK floor: wall {ours[0] - sdk[0]:+.3f} s, "
        f"cpu {ours[1] - sdk[1]:+.3f} s; ratio gpudiag/SDK wall {ours[0] / sdk[0]:.2f}, "
        f"cpu {ours[1] / sdk[1]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
